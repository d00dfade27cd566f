"""The detokenizer process: incremental, UTF-8-safe decoding and stop strings."""
