"""OpenAI's Files and Batch APIs over the serving runtime, with durable state (API process)."""
