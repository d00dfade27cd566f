"""The no-sharing cache used with `disable_radix_cache`: every request owns all of its KV.

Runs in the scheduler process; exists so RadixCache can be measured against doing nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache, MatchResult
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool

if TYPE_CHECKING:
    from radixgen.runtime.mem_cache.radix_cache import TreeNode
    from radixgen.runtime.scheduler.req import Req

_EMPTY = torch.empty(0, dtype=torch.long)


class ChunkCache(BasePrefixCache):
    def __init__(self, req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.kv_pool = kv_pool

    def match_prefix(self, key: list[int], namespace: str | None = None) -> MatchResult:
        return MatchResult(_EMPTY, None)

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        pass

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        pass

    def cache_finished_req(self, req: Req) -> None:
        row = req.req_pool_idx
        assert row is not None
        self.kv_pool.free(self.req_to_token_pool.req_to_token[row, : req.kv_len].clone())
        self.req_to_token_pool.free(row)
        req.release_kv()

    def cache_unfinished_req(self, req: Req, length: int | None = None) -> None:
        pass  # the request keeps its slots; nothing is shared

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass

    def check_invariants(self) -> None:
        pass  # no bookkeeping of its own: requests own every slot
