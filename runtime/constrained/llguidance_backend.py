"""llguidance backend: JSON schema, regex, GBNF/Lark, choices, any-JSON-object (scheduler process).

llguidance has no compile cache and builds lexers lazily, so "compiling" here means validating
the grammar and building one pristine `LLMatcher`; each request gets a `deep_copy` of it (µs).
Its tokenizer is built from our raw token bytes (special tokens as b"\\xff<name>", llguidance's
marker), so it shares the exact vocabulary the other backends see.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import llguidance
import torch

from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarBackend, BaseGrammarObject
from radixgen.runtime.constrained.grammar_spec import (
    ANY_JSON_OBJECT_SCHEMA,
    GRAMMAR_KINDS,
    clean_library_message,
    invalid,
    load_choices,
    load_json_schema,
    utf8_prefix,
)
from radixgen.runtime.constrained.schema_checks import relax_for_checks
from radixgen.runtime.constrained.schema_rewrite import rewrite_spec
from radixgen.runtime.constrained.schema_support import (
    LLGUIDANCE_FORMATS,
    close_objects,
    refuse_gaps,
    strip_unknown_formats,
)

if TYPE_CHECKING:
    from radixgen.runtime.constrained.vocab import GrammarVocab
    from radixgen.server_args import GrammarConfig


class _RawVocabTokenizer:
    """The object `llguidance.TokenizerWrapper` reads: token bytes, ids, and an encode call."""

    def __init__(self, vocab: GrammarVocab, encode: Callable[[str], list[int]]) -> None:
        self.tokens = [
            b if b else b"\xff" + vocab.special_token_names.get(i, f"<special_{i}>").encode()
            for i, b in enumerate(vocab.token_bytes)
        ]
        self.eos_token_id = vocab.eos_token_ids[0]
        self.bos_token_id = None
        self.special_token_ids = sorted(vocab.special_token_ids)
        self._encode = encode

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # tells the wrapper to pass str, not bytes
            raise TypeError("text must be str")
        return self._encode(text)


class LLGuidanceGrammar(BaseGrammarObject):
    """A request's copy of the spec's pristine matcher."""

    __slots__ = ("eos_token_ids", "matcher", "terminated")

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: frozenset[int]) -> None:
        self.matcher = matcher
        self.eos_token_ids = eos_token_ids
        self.terminated = False

    def accept_token(self, token_id: int) -> bool:
        if self.terminated:
            return False
        if token_id in self.eos_token_ids:  # validate_tokens() never counts a stop token
            if not self.matcher.is_accepting():
                return False
            self.terminated = self.matcher.consume_token(token_id)
            return self.terminated
        # NOTE: a rejected token puts an LLMatcher into a permanent error state; check first
        if self.matcher.validate_tokens([token_id]) != 1:
            return False
        return self.matcher.consume_token(token_id)

    def accept_tokens(self, token_ids: list[int]) -> int:
        if self.terminated:
            return 0
        n = self.matcher.validate_tokens(token_ids)
        if n and not self.matcher.consume_tokens(token_ids[:n]):
            return 0
        if (
            n < len(token_ids)
            and token_ids[n] in self.eos_token_ids
            and self.accept_token(token_ids[n])
        ):
            n += 1
        return n

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        target = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * 4)
        return True

    def find_jump_forward_string(self) -> str:
        if self.terminated:
            return ""
        return utf8_prefix(self.matcher.compute_ff_bytes())

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0 and self.terminated:
            num_tokens -= 1  # a consumed stop token is not in llguidance's token history
            self.terminated = False
        if num_tokens > 0:
            self.matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self.terminated

    def copy(self) -> LLGuidanceGrammar:
        twin = LLGuidanceGrammar(self.matcher.deep_copy(), self.eos_token_ids)
        twin.terminated = self.terminated
        return twin


class LLGuidanceBackend(BaseGrammarBackend):
    name = "llguidance"
    supported_kinds = frozenset(GRAMMAR_KINDS)
    # NOTE: an LLMatcher cannot cross processes, so compiles stay on threads (they are ~1 ms:
    # the lexer is built lazily, during decoding); a pristine matcher is small
    estimated_compiled_bytes = 256 * 1024

    def __init__(self, vocab: GrammarVocab, config: GrammarConfig) -> None:
        super().__init__(vocab, config)
        assert vocab.encode is not None, "llguidance needs the tokenizer's encode"
        wrapper = llguidance.TokenizerWrapper(_RawVocabTokenizer(vocab, vocab.encode))
        self.lltok = llguidance.LLTokenizer(
            wrapper, n_vocab=vocab.vocab_size, eos_token=list(vocab.eos_token_ids)
        )
        self.eos_token_ids = frozenset(vocab.eos_token_ids)
        pattern = config.constrained_json_whitespace_pattern
        self._json_overrides: dict[str, Any] = (
            {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
            if pattern is None
            else {"whitespace_flexible": True, "whitespace_pattern": pattern}
        )

    def _compile(self, kind: str, spec: str) -> llguidance.LLMatcher:
        if kind == "json_schema":
            # the checked layer validates what relax_for_checks drops
            schema = relax_for_checks(load_json_schema(rewrite_spec(spec)[0]))
            refuse_gaps(self.name, schema)  # any oneOf left is disjoint: anyOf is then exact
            # NOTE: objects closed as in xgrammar's strict mode, so the backends agree
            schema = close_objects(strip_unknown_formats(schema, LLGUIDANCE_FORMATS))
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema),
                overrides={**self._json_overrides, "coerce_one_of": True},  # type: ignore[arg-type]
            )
        elif kind == "json_object":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                ANY_JSON_OBJECT_SCHEMA,
                overrides=self._json_overrides,  # type: ignore[arg-type]
            )
        elif kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(spec)
        elif kind == "ebnf":
            grammar = llguidance.grammar_from("gbnf", spec)
        else:
            grammar = llguidance.grammar_from("choice", json.dumps(load_choices(spec)))
        error = llguidance.LLMatcher.validate_grammar(grammar, self.lltok)
        if error:
            raise invalid(kind, clean_library_message(error))
        matcher = llguidance.LLMatcher(self.lltok, grammar, log_level=0)
        if matcher.is_error():
            raise invalid(kind, clean_library_message(matcher.get_error()))
        return matcher

    def create_grammar(self, compiled: llguidance.LLMatcher) -> LLGuidanceGrammar:
        return LLGuidanceGrammar(compiled.deep_copy(), self.eos_token_ids)
