"""Cache-aware order of a batch's lines (API process): lines whose prompts start alike run
together, so a shared prefix (system prompt, schema, few-shot block, document) is prefilled once
and reused from the radix cache while it is still there, whatever order the user wrote them in.

Lines are grouped by the start of their prompt at a few lengths, coarse to fine (a trie over
`PREFIX_CHARS`): a group goes where its first line was, and lines keep their input order inside
a group. The runner's bound on lines in flight keeps each group's lines admitted together. Only
hashes and first-seen indices are kept per line: O(lines) memory and one sort.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# prompt characters compared, coarse to fine (a short shared system prompt groups at 32 or 128;
# ~2,000 tokens at the finest)
PREFIX_CHARS = (32, 128, 512, 2048, 8192)
# the body fields a prompt is built from, in the order they are rendered into it (tools and
# instructions go in the system turn; chat messages, Responses input, completion prompts)
_PROMPT_FIELDS = ("tools", "instructions", "messages", "input", "prompt")


def prompt_start(body: dict[str, Any], limit: int = PREFIX_CHARS[-1]) -> str:
    """The start of what a request body's prompt is built from (not the rendered template:
    what differs here differs there)."""
    parts: list[str] = []
    size = 0
    for field in _PROMPT_FIELDS:
        if field in body and size < limit:
            text = json.dumps(body[field], sort_keys=True, ensure_ascii=False)
            parts.append(text)
            size += len(text)
    return "\x00".join(parts)[:limit]


def cache_aware_order(items: Sequence[T], body_of: Callable[[T], dict[str, Any]]) -> list[T]:
    """`items` reordered so those sharing a prompt start are adjacent (see the module doc)."""
    first_seen: list[dict[int, int]] = [{} for _ in PREFIX_CHARS]
    keys: list[tuple[int, ...]] = []
    for i, item in enumerate(items):
        start = prompt_start(body_of(item))
        groups = (
            seen.setdefault(hash(start[:n]), i)
            for seen, n in zip(first_seen, PREFIX_CHARS, strict=True)
        )
        keys.append((*groups, i))
    return [items[i] for i in sorted(range(len(items)), key=keys.__getitem__)]
