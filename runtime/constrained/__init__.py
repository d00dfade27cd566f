"""Constrained decoding: grammar backends, compile cache, token masks, jump-forward (scheduler process).

`GrammarManager` (grammar_manager.py) is what the scheduler talks to; backends (xgrammar,
outlines-core, llguidance) are chosen by name through `registry.create_grammar_backend` and
imported only when chosen.
"""
