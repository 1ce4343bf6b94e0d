"""OpenAI-compatible API, API keys, tracker commands, health and dashboard plumbing."""
