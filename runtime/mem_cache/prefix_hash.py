"""Hash chains over page-aligned token prefixes: the key of a KV block outside the pool.

Runs in the scheduler process. A block of KV is only valid after exactly the tokens before it,
so its key is a chain: h(k) = H(h(k-1), tokens of block k), seeded with a digest of what makes
the KV valid. Lower cache tiers (the host tier; a file tier later) key their blocks by it, so a
lookup needs no tree and two tiers agree on what a block is.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator

DIGEST_BYTES = 16


def chain_hashes(tokens: list[int], block: int, seed: bytes = b"") -> Iterator[bytes]:
    """The key of each whole block of `tokens`, in order (lazily: callers stop at a miss)."""
    h = seed
    for start in range(0, len(tokens) - block + 1, block):
        d = hashlib.blake2b(h, digest_size=DIGEST_BYTES)
        d.update(array("q", tokens[start : start + block]).tobytes())
        h = d.digest()
        yield h
