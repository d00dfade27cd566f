"""The serving runtime, one subpackage per process or role (the README's code map lists them).

Nothing is imported here so that light processes (API, detokenizer) import only what they use.
"""
