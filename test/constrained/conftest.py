"""Fixtures for grammar tests: the real default tokenizer, its grammar vocabulary, backends, requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from grammar_helpers import EOS, VOCAB_SIZE

from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarBackend
from radixgen.runtime.constrained.registry import create_grammar_backend
from radixgen.runtime.constrained.vocab import GrammarVocab
from radixgen.runtime.text.tokenizer import Tokenizer
from radixgen.server_args import GrammarConfig


@pytest.fixture(scope="session")
def tokenizer(default_model_folder: str) -> Tokenizer:
    """The real default model's tokenizer (the GGUF is converted once per machine)."""
    return Tokenizer(default_model_folder)


@pytest.fixture(scope="session")
def vocab(tokenizer: Tokenizer) -> GrammarVocab:
    return GrammarVocab.from_tokenizer(tokenizer, VOCAB_SIZE, [EOS])


@pytest.fixture(scope="session")
def backends(vocab: GrammarVocab) -> dict[str, BaseGrammarBackend]:
    """One backend per library, built on first use (their tokenizer setup costs up to 0.5 s)."""
    cache: dict[str, BaseGrammarBackend] = {}

    class _Lazy(dict):
        def __missing__(self, name: str) -> BaseGrammarBackend:
            cache[name] = create_grammar_backend(name, vocab, GrammarConfig(grammar_backend=name))
            self[name] = cache[name]
            return cache[name]

    return _Lazy()


@pytest.fixture(scope="session")
def compiled(backends: dict[str, BaseGrammarBackend]) -> Callable[[str, str, str], Any]:
    """compiled(backend, kind, spec_text) -> (backend, compiled grammar), cached for the session
    (outlines' any-JSON-object DFA alone takes seconds to build)."""
    memo: dict[tuple[str, str, str], Any] = {}

    def get(name: str, kind: str, spec: str) -> Any:
        key = (name, kind, spec)
        if key not in memo:
            memo[key] = backends[name].compile(kind, spec)
        return backends[name], memo[key]

    return get


@pytest.fixture
def encode(tokenizer: Tokenizer) -> Callable[[str], list[int]]:
    return lambda text: tokenizer.encode(text, add_special_tokens=False)
