"""Tokenizer and chat templates, used by every process (no torch)."""
