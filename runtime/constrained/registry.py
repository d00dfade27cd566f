"""Grammar backend registry: name -> backend class, imported only when chosen (scheduler process).

Each backend pulls in a native library at import, so a server using xgrammar never loads
outlines-core or llguidance.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from radixgen.errors import InvalidRequestError

if TYPE_CHECKING:
    from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarBackend
    from radixgen.runtime.constrained.vocab import GrammarVocab
    from radixgen.server_args import GrammarConfig

# name -> "module:Class" under radixgen.runtime.constrained
GRAMMAR_BACKENDS: dict[str, str] = {
    "xgrammar": "xgrammar_backend:XGrammarBackend",
    "outlines": "outlines_backend:OutlinesBackend",
    "llguidance": "llguidance_backend:LLGuidanceBackend",
}


def grammar_backend_class(name: str) -> type[BaseGrammarBackend]:
    if name not in GRAMMAR_BACKENDS:
        known = ", ".join(sorted(GRAMMAR_BACKENDS))
        raise InvalidRequestError(
            f"unknown grammar backend '{name}' (known: {known})", "grammar_backend"
        )
    module_name, class_name = GRAMMAR_BACKENDS[name].split(":")
    module = importlib.import_module(f"radixgen.runtime.constrained.{module_name}")
    cls: type[BaseGrammarBackend] = getattr(module, class_name)
    return cls


def create_grammar_backend(
    name: str, vocab: GrammarVocab, config: GrammarConfig
) -> BaseGrammarBackend:
    """Build the named backend for this model's vocabulary (once per scheduler: 0.02-0.5 s)."""
    return grammar_backend_class(name)(vocab, config)
