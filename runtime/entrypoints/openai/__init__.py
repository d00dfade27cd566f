"""OpenAI-compatible API: request models, completions and chat handlers, tool-call parsing."""
