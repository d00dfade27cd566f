"""Model architectures (scheduler process) and the architecture facts read from config.json (any process)."""
