"""Engine adapters: each engine's /metrics page and per-request fields into one normalised form."""
