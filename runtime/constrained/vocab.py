"""The model's vocabulary as grammar engines need it: raw token bytes, stop ids, special ids (scheduler process).

Built once per scheduler from `Tokenizer.token_bytes` rather than each library's own tokenizer
import: the GGUF-derived tokenizer hides its special tokens from xgrammar's HF import, so we hand
every backend the raw bytes ourselves (b"" for added/special tokens, which no grammar may emit).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixgen.runtime.text.tokenizer import Tokenizer


@dataclass
class GrammarVocab:
    """Token bytes indexed by id, padded with b"" up to the model's (lm_head) vocab size."""

    token_bytes: list[bytes]
    eos_token_ids: list[int]
    special_token_ids: frozenset[int]
    special_token_names: dict[int, str] = field(default_factory=dict)
    encode: Callable[[str], list[int]] | None = None  # text -> ids, no special tokens added

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int]
    ) -> GrammarVocab:
        raw = list(tokenizer.token_bytes[:vocab_size])
        raw.extend([b""] * (vocab_size - len(raw)))  # lm_head rows beyond the tokenizer
        special = set(tokenizer.added_token_ids) | set(eos_token_ids)
        special.update(i for i, b in enumerate(raw) if not b)
        names = {i: tokenizer.id_to_token(i) or f"<special_{i}>" for i in sorted(special)}

        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

        return cls(raw, list(eos_token_ids), frozenset(special), names, encode)

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @cached_property
    def extendable(self) -> list[bool]:
        """extendable[t]: token t's bytes are a strict prefix of another token's bytes.

        A jump-forward tail must not end with such a token: the tokenizer could have merged it
        with the text that follows, so the model would see a non-canonical split.
        """
        prefixes: set[bytes] = set()
        for b in self.token_bytes:
            for k in range(1, len(b)):
                prefixes.add(b[:k])
        return [bool(b) and b in prefixes for b in self.token_bytes]

    @cached_property
    def _sorted_token_bytes(self) -> tuple[list[bytes], list[int]]:
        pairs = sorted((b, i) for i, b in enumerate(self.token_bytes) if b)
        return [b for b, _ in pairs], [i for _, i in pairs]

    @cached_property
    def _longer_memo(self) -> dict[int, tuple[int, ...]]:
        return {}

    def longer_tokens(self, token_id: int) -> tuple[int, ...]:
        """Ids of the tokens whose bytes strictly extend token `token_id`'s (memoised)."""
        memo = self._longer_memo
        found = memo.get(token_id)
        if found is None:
            prefix = self.token_bytes[token_id]
            keys, ids = self._sorted_token_bytes
            j = bisect_left(keys, prefix)
            out: list[int] = []
            while j < len(keys) and keys[j].startswith(prefix):
                if len(keys[j]) > len(prefix):
                    out.append(ids[j])
                j += 1
            found = memo[token_id] = tuple(out)
        return found

    def join(self, ids: list[int]) -> bytes:
        """The exact bytes of a token sequence (special tokens contribute nothing)."""
        tb = self.token_bytes
        return b"".join(tb[i] for i in ids)
