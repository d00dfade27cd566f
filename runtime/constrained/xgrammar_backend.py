"""xgrammar backend (the default): JSON schema, regex, EBNF, choices and any-JSON-object (scheduler process).

The vocabulary is handed over as raw bytes (VocabType.RAW) with b"" for added/special tokens:
`TokenizerInfo.from_huggingface` finds no special tokens in our GGUF-derived tokenizer and would
then allow `<|im_start|>` and friends inside JSON strings. Stop tokens are the model's EOS ids.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import torch
import xgrammar as xgr

from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarBackend, BaseGrammarObject
from radixgen.runtime.constrained.grammar_spec import (
    ANY_JSON_OBJECT_SCHEMA,
    GRAMMAR_KINDS,
    choices_to_ebnf,
    load_choices,
    load_json_schema,
)
from radixgen.runtime.constrained.schema_checks import relax_for_checks
from radixgen.runtime.constrained.schema_rewrite import rewrite_spec
from radixgen.runtime.constrained.schema_support import drop_false_properties, refuse_gaps

if TYPE_CHECKING:
    from radixgen.runtime.constrained.vocab import GrammarVocab
    from radixgen.server_args import GrammarConfig

# Measured on 2 cores: filling rows one by one costs 1-8 µs per row, while the thread-pool batch
# call has ~80 µs fixed overhead (B=32: 104 µs looped vs 204 µs batched). Batch only when big.
BATCH_FILL_MIN_ROWS = 128


class XGrammarGrammar(BaseGrammarObject):
    """A request's xgrammar matcher."""

    __slots__ = ("matcher",)

    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        return self.matcher.fill_next_token_bitmask(bitmask, row)

    def find_jump_forward_string(self) -> str:
        if self.matcher.is_terminated():  # xgrammar raises after the stop token
            return ""
        return self.matcher.find_jump_forward_string()

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self.matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def copy(self) -> XGrammarGrammar:
        return XGrammarGrammar(self.matcher.fork())


class XGrammarBackend(BaseGrammarBackend):
    name = "xgrammar"
    supported_kinds = frozenset(GRAMMAR_KINDS)
    compiles_in_worker_process = True

    def __init__(self, vocab: GrammarVocab, config: GrammarConfig) -> None:
        super().__init__(vocab, config)
        info = xgr.TokenizerInfo(
            vocab.token_bytes,
            xgr.VocabType.RAW,
            vocab_size=vocab.vocab_size,
            stop_token_ids=vocab.eos_token_ids,
        )
        self.tokenizer_info = info
        threads = max(1, min(8, os.cpu_count() or 1))
        # our GrammarManager caches compiled grammars; xgrammar's own cache would duplicate it
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self._batch_matcher: xgr.BatchGrammarMatcher | None = None
        if config.constrained_json_whitespace_pattern is None:
            self._json_options: dict[str, Any] = {"any_whitespace": False, "separators": (",", ":")}
        else:  # xgrammar cannot take a pattern: allow JSON whitespace wherever JSON does
            self._json_options = {"any_whitespace": True}

    def _compile(self, kind: str, spec: str) -> xgr.CompiledGrammar:
        if kind == "json_schema":
            # a clear message for text that is not JSON at all; and a 400 naming what xgrammar
            # would serve unenforced (the manager routes such schemas to llguidance first)
            spec, rewrites = rewrite_spec(spec)
            schema = load_json_schema(spec)
            relaxed = relax_for_checks(schema)  # the checked layer validates what it drops
            if rewrites or relaxed is not schema:
                # the rewrites' "absent" properties, in the form xgrammar takes
                schema = drop_false_properties(relaxed)
                spec = json.dumps(schema)
            refuse_gaps(self.name, schema)
            # NOTE: strict_mode treats a missing additionalProperties as false (no extra keys)
            return self.compiler.compile_json_schema(spec, strict_mode=True, **self._json_options)
        if kind == "json_object":
            return self.compiler.compile_json_schema(
                ANY_JSON_OBJECT_SCHEMA, strict_mode=False, **self._json_options
            )
        if kind == "regex":
            return self.compiler.compile_regex(spec)
        if kind == "ebnf":
            return self.compiler.compile_grammar(spec, root_rule_name="root")
        assert kind == "choices", kind
        return self.compiler.compile_grammar(choices_to_ebnf(load_choices(spec)))

    def serialize_compiled(self, compiled: xgr.CompiledGrammar) -> str:
        return compiled.serialize_json()

    def deserialize_compiled(self, payload: str) -> xgr.CompiledGrammar:
        return xgr.CompiledGrammar.deserialize_json(payload, self.tokenizer_info)

    def compiled_size_bytes(self, compiled: xgr.CompiledGrammar) -> int:
        return int(compiled.memory_size_bytes)

    def create_grammar(self, compiled: xgr.CompiledGrammar) -> XGrammarGrammar:
        return XGrammarGrammar(xgr.GrammarMatcher(compiled))

    def fill_bitmask(self, grammars: list[BaseGrammarObject], bitmask: torch.Tensor) -> list[bool]:
        if len(grammars) < BATCH_FILL_MIN_ROWS:
            return [g.fill_next_token_bitmask(bitmask, i) for i, g in enumerate(grammars)]
        if self._batch_matcher is None:
            self._batch_matcher = xgr.BatchGrammarMatcher(max_threads="auto")
        matchers = [g.matcher for g in grammars]  # type: ignore[attr-defined]
        self._batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask)
        return (bitmask[: len(grammars)] != -1).any(dim=1).tolist()
