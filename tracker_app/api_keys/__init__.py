"""Client API keys: issuing and looking them up (``services``), DRF
authentication (``authentication``) and the per-key rate limit (``rate_limit``)."""
