"""Torch-free libraries that both the tracker and the nodes import.

Where the wire's declarations are ``nodes_app.protocol`` (standard library
only), these need more (transformers' tokenizers without torch, llguidance,
cryptography) but never torch, Django or the runtime: the tracker loads
them, and an import-linter contract keeps ``nodes_app.runtime`` out.

- ``catalogue``: the models the project ships and their keys.
- ``families``: which decoder families are served, and why a checkpoint
  outside them is refused.
- ``sources``: where a model's weights come from (``package:``, a GGUF
  file, a directory, a hub id); ``model_errors``: what is wrong with them.
- ``tokenization``: a model's tokenizer and its text facts, loaded without
  torch; ``prompting``: chat templates to token ids, the tracker's count
  and the head's prompt; ``grammar``: structured-output grammars.
- ``signing``: wallets, plan, registration and challenge signatures.
"""
