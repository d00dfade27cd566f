"""Constrained decoding: grammar backends, compile cache, token masks, jump-forward (scheduler process)."""
