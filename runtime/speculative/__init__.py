"""Speculative decoding: n-gram drafts from each request's own tokens, verified in one step."""
