"""outlines-core backend: regular languages only (JSON schema via regex, regex, choices) (scheduler process).

outlines-core compiles a regex into a token-level DFA `Index`; that build is the expensive step
(tens of ms to seconds) and is what the compile cache keeps. It has no CFG, so EBNF and
any-JSON-object are refused, and its schema-to-regex conversion ignores numeric bounds and a few
other keywords, so schemas using them are refused rather than served unenforced. Jump-forward walks the DFA while exactly
one next byte is possible (outlines-core has no API for it); results are cached per DFA state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from outlines_core import Guide, Index, Vocabulary
from outlines_core.json_schema import build_regex_from_schema

from radixgen.runtime.constrained.base_grammar_backend import (
    MAX_ROLLBACK_TOKENS,
    BaseGrammarBackend,
    BaseGrammarObject,
)
from radixgen.runtime.constrained.grammar_spec import (
    choices_to_regex,
    invalid,
    load_choices,
    load_json_schema,
    refuse_unenforceable,
    utf8_prefix,
)

if TYPE_CHECKING:
    from radixgen.runtime.constrained.vocab import GrammarVocab
    from radixgen.server_args import GrammarConfig

# keywords build_regex_from_schema drops although they restrict valid instances
_UNENFORCED_KEYWORDS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "contains",
    "not",
    "if",
    "dependentRequired",
    "dependentSchemas",
)
MAX_FORCED_BYTES = 1024


@dataclass
class OutlinesCompiled:
    """A compiled DFA plus the forced-bytes memo, shared by every request of the spec."""

    index: Index
    eos_token_id: int
    first_byte: np.ndarray  # first byte of each token id, -1 for tokens without bytes
    byte_token: list[int | None]  # the single-byte token for each byte value
    forced: dict[int, bytes] = field(default_factory=dict)

    def forced_bytes(self, state: int) -> bytes:
        """Bytes every continuation from `state` starts with (memoised for the whole walk)."""
        hit = self.forced.get(state)
        if hit is not None:
            return hit
        walk: list[tuple[int, int]] = []  # (state, byte) along the forced path
        seen: set[int] = set()
        s: int | None = state
        while s is not None and s not in seen and len(walk) < MAX_FORCED_BYTES:
            if s in self.forced:
                break
            seen.add(s)
            b = self._only_next_byte(s)
            if b is None:
                self.forced[s] = b""
                break
            walk.append((s, b))
            s = self.index.get_next_state(s, self.byte_token[b])
        tail = self.forced.get(s, b"") if s is not None else b""
        for st, b in reversed(walk):
            tail = bytes([b]) + tail
            self.forced[st] = tail
        return self.forced.get(state, b"")

    def _only_next_byte(self, state: int) -> int | None:
        if self.index.is_final_state(state):
            return None  # the model may stop here
        allowed = self.index.get_allowed_tokens(state)
        if not allowed:
            return None
        firsts = self.first_byte[np.asarray(allowed, dtype=np.int64)]
        b = int(firsts[0])
        if b < 0 or not bool((firsts == b).all()) or self.byte_token[b] is None:
            return None
        return b


class OutlinesGrammar(BaseGrammarObject):
    """A request's outlines-core Guide; EOS is tracked here (it is not a DFA transition)."""

    __slots__ = ("compiled", "guide", "history", "terminated")

    def __init__(self, compiled: OutlinesCompiled) -> None:
        self.compiled = compiled
        self.guide = Guide(compiled.index, max_rollback=MAX_ROLLBACK_TOKENS)
        self.history: list[int] = []  # accepted tokens, for copy()
        self.terminated = False

    def accept_token(self, token_id: int) -> bool:
        if self.terminated:
            return False
        if token_id == self.compiled.eos_token_id:
            if not self.guide.is_finished():
                return False
            self.terminated = True
            return True
        try:
            self.guide.advance(token_id, return_tokens=False)
        except ValueError:
            return False
        self.history.append(token_id)
        return True

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        target = bitmask[row]
        if self.terminated:
            target.zero_()
            return True
        self.guide.write_mask_into(target.data_ptr(), target.numel(), target.element_size())
        return True

    def find_jump_forward_string(self) -> str:
        if self.terminated:
            return ""
        return utf8_prefix(self.compiled.forced_bytes(self.guide.get_state()))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        if self.terminated:
            self.terminated = False
            num_tokens -= 1
        if num_tokens:
            self.guide.rollback_state(num_tokens)
            del self.history[-num_tokens:]

    def is_terminated(self) -> bool:
        return self.terminated

    def copy(self) -> OutlinesGrammar:
        twin = OutlinesGrammar(self.compiled)
        for t in self.history:  # a fresh Guide keeps its own rollback window
            twin.guide.advance(t, return_tokens=False)
        twin.history = list(self.history)
        twin.terminated = self.terminated
        return twin


class OutlinesBackend(BaseGrammarBackend):
    name = "outlines"
    # NOTE: json_object is refused too: the any-object regex takes ~11 s to turn into a DFA here
    # and, being depth-limited, still rejects valid nested objects
    supported_kinds = frozenset({"json_schema", "regex", "choices"})
    # NOTE: an Index cannot be serialized, so compiles stay on threads; its size is not
    # exposed either: a DFA over this 49k vocabulary is assumed to hold a few MB
    estimated_compiled_bytes = 4 * 1024 * 1024

    def __init__(self, vocab: GrammarVocab, config: GrammarConfig) -> None:
        super().__init__(vocab, config)
        self.eos_token_id = vocab.eos_token_ids[0]
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b and i not in vocab.special_token_ids:  # bytes keys: str keys lose partial UTF-8
                by_bytes.setdefault(b, []).append(i)
        self.vocabulary = Vocabulary(self.eos_token_id, by_bytes)
        self.first_byte = np.array([b[0] if b else -1 for b in vocab.token_bytes], dtype=np.int16)
        self.byte_token: list[int | None] = [None] * 256
        for b, ids in by_bytes.items():
            if len(b) == 1:
                self.byte_token[b[0]] = ids[0]
        # "" = compact JSON (no whitespace between tokens), the default for every backend
        self.whitespace = config.constrained_json_whitespace_pattern or ""

    def _compile(self, kind: str, spec: str) -> OutlinesCompiled:
        if kind == "json_schema":
            refuse_unenforceable(self.name, load_json_schema(spec), _UNENFORCED_KEYWORDS)
            regex = build_regex_from_schema(spec, self.whitespace)
        elif kind == "choices":
            regex = choices_to_regex(load_choices(spec))
        else:
            regex = spec
        try:
            index = Index(regex, self.vocabulary)
        except ValueError as e:
            if kind == "regex":
                raise invalid("regex", _explain_regex(spec, e)) from None
            raise
        return OutlinesCompiled(index, self.eos_token_id, self.first_byte, self.byte_token)

    def create_grammar(self, compiled: OutlinesCompiled) -> OutlinesGrammar:
        return OutlinesGrammar(compiled)


def _explain_regex(spec: str, error: Exception) -> str:
    """outlines-core says only "Failed to build DFA"; Python's parser usually says why."""
    try:
        re.compile(spec)
    except re.error as py_error:
        return f"{py_error} (outlines-core: {error})"
    return str(error)
