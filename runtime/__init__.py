"""The serving runtime: launcher, HTTP server, managers, scheduler, caches, grammar, models.

Nothing is imported here so that light processes (API, detokenizer) import only what they use.
"""
