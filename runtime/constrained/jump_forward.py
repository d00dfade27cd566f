"""Jump-forward planning: turn grammar-forced text into tokens the way the tokenizer would (scheduler process).

SGLang's compressed-FSM idea: when the grammar admits a single continuation string, append it
without a model step per token. Appending the forced text's own tokens after the sampled ones
would give a split the model never sees in training (`{` + `"name` instead of `{"` + `name`),
so the tail of the output is re-tokenized together with the forced text and only the part
after the common prefix is replaced. This module is pure planning; `GrammarManager` applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixgen.runtime.constrained.base_grammar_backend import MAX_ROLLBACK_TOKENS

if TYPE_CHECKING:
    from radixgen.runtime.constrained.vocab import GrammarVocab

# Output tokens re-tokenized with the forced text. Merges rarely reach back more than a token or
# two; a small window keeps the cost (and the KV recomputed when tokens change) small.
JUMP_FORWARD_WINDOW = 8
assert JUMP_FORWARD_WINDOW < MAX_ROLLBACK_TOKENS


@dataclass(frozen=True)
class JumpPlan:
    """Replace output_ids[keep:] by `tokens`: the replaced text plus forced text.

    `last_may_grow`: the last token is a strict prefix of longer tokens. If the grammar allows
    one of those next, the tokenizer could have merged it with the text that follows, so the
    last token must be left to the model; `replaced_bytes` is what the tail must still exceed.
    """

    keep: int
    tokens: list[int]
    last_may_grow: bool
    replaced_bytes: int


def plan_jump_forward(
    output_ids: list[int],
    forced: str,
    vocab: GrammarVocab,
    min_keep: int,
    max_len: int,
    window: int = JUMP_FORWARD_WINDOW,
) -> JumpPlan | None:
    """Plan appending `forced` after `output_ids`, or None when it would add nothing safely.

    min_keep: output tokens that must stay (their KV is shared through the prefix cache).
    max_len: the output may hold at most this many tokens afterwards (max_new_tokens - 1, so
    the request still samples its last token and ends with finish_reason length).
    """
    assert vocab.encode is not None
    n = len(output_ids)
    start = _window_start(output_ids, vocab, max(min_keep, n - window))
    if start is None:
        return None
    old = output_ids[start:]
    old_bytes = vocab.join(old)
    text = old_bytes.decode("utf-8", errors="strict") + forced
    new_ids = vocab.encode(text)
    if vocab.join(new_ids) != text.encode("utf-8"):
        return None  # the tokenizer normalised the text: its tokens would not spell the grammar's
    common = _common_prefix_len(old, new_ids)
    keep = start + common
    tail = new_ids[common:]
    del tail[max(0, max_len - keep) :]
    replaced_bytes = len(old_bytes) - len(vocab.join(old[:common]))
    if not tail or len(vocab.join(tail)) <= replaced_bytes:
        return None  # no forced text left (and never drop text the model already produced)
    return JumpPlan(keep, tail, vocab.extendable[tail[-1]], replaced_bytes)


def _window_start(output_ids: list[int], vocab: GrammarVocab, start: int) -> int | None:
    """First index >= start whose suffix is whole UTF-8 text without special tokens."""
    n = len(output_ids)
    for i in range(n - 1, start - 1, -1):
        if not vocab.token_bytes[output_ids[i]]:  # special tokens cannot be re-derived from text
            start = i + 1
            break
    for s in range(start, min(start + 4, n + 1)):  # the window may begin inside a character
        try:
            vocab.join(output_ids[s:]).decode("utf-8", errors="strict")
        except UnicodeDecodeError:
            continue
        return s
    return None


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
