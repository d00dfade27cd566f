"""HiRadixCache on its own: what the pool evicts comes back from the host tier bit for bit (every
KV storage format, scales included), page-aligned, owned by the tree, with the pool's accounting
exact; the host tier keeps its own capacity and LRU."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.kv_quant import dequantize_kv, quantize_kv, resolve_kv_cache_format
from radixgen.runtime.mem_cache.hiradix_cache import HiRadixCache, host_block_tokens
from radixgen.runtime.mem_cache.host_codec import HostCompression
from radixgen.runtime.mem_cache.host_tier import HostKVTier
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.mem_cache.prefix_hash import chain_hashes
from radixgen.runtime.scheduler.accounting import check_kv_accounting

LAYERS, HEADS, DIM = 2, 2, 8


def _cache(kv: str, page: int, pool_tokens: int = 96, host_blocks: int = 16):
    fmt = resolve_kv_cache_format(kv, torch.float32)
    pool = TokenToKVPool(pool_tokens, page, LAYERS, HEADS, DIM, torch.float32, kv_format=fmt)
    rows = ReqToTokenPool(2, 256)
    host = HostKVTier(host_blocks, host_block_tokens(page))
    return HiRadixCache(rows, pool, page, host), pool, rows


def _fill(pool: TokenToKVPool, tokens: list[int]) -> torch.Tensor:
    slots = pool.alloc(len(tokens))
    assert slots is not None
    gen = torch.Generator().manual_seed(len(tokens))
    for layer in range(LAYERS):
        k = torch.randn(len(tokens), HEADS, DIM, generator=gen)
        v = torch.randn(len(tokens), HEADS, DIM, generator=gen)
        pool.set_kv(layer, slots, k, v)
    return slots


def test_block_size_is_whole_pages_of_at_least_16_tokens():
    assert [host_block_tokens(p) for p in (1, 4, 5, 16, 64)] == [16, 16, 20, 16, 64]


def test_chain_hashes_depend_on_the_whole_prefix():
    a = list(chain_hashes([1, 2, 3, 4], 2))
    b = list(chain_hashes([9, 2, 3, 4], 2))
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]  # same second block, other prefix
    assert list(chain_hashes([1, 2, 3, 4, 5], 2)) == a  # a partial block has no key
    assert list(chain_hashes([1, 2, 3, 4], 2, seed=b"x")) != a


@pytest.mark.parametrize("kv", ["auto", "bf16", "int8", "fp8_e4m3"])
@pytest.mark.parametrize("page", [1, 4])
def test_evicted_kv_comes_back_bit_for_bit(kv: str, page: int):
    cache, pool, rows = _cache(kv, page)
    tokens = [(5 * i) % 13 + 1 for i in range(48)]
    slots = _fill(pool, tokens)
    before = pool.read_slots(slots)
    cache.insert(tokens, slots)
    assert cache.evict(48) == 48
    check_kv_accounting(pool, cache, rows, [])
    assert pool.available_size() == pool.size and len(cache.host) == 3
    pool.free(_fill(pool, [0] * 48))  # overwrite the freed pages with other KV
    got = cache.match_and_load([*tokens, 99])
    assert got.indices.numel() == 48 and got.host_tokens == 48
    assert got.indices.numel() % page == 0
    after = pool.read_slots(got.indices)
    for x, y in ((before.k, after.k), (before.v, after.v), (before.k_scale, after.k_scale)):
        assert (x is None) == (y is None)
        if x is not None and y is not None:
            assert torch.equal(x, y)
    check_kv_accounting(pool, cache, rows, [])
    assert cache.evictable_size() == 48  # owned by the tree, unlocked
    assert cache.match_and_load(tokens).host_tokens == 0  # now a plain pool hit


def test_a_load_continues_a_prefix_the_pool_still_holds():
    cache, pool, rows = _cache("auto", 1)
    tokens = list(range(1, 41))
    cache.insert(tokens[:24], _fill(pool, tokens[:24]))
    tail = _fill(pool, tokens[24:])  # the rest of the sequence, as its own leaf
    head = cache.match_prefix(tokens[:24]).indices
    cache.insert(tokens, torch.cat([head, tail]))
    cache.inc_lock_ref(cache.match_prefix(tokens[:24]).last_node)  # keep the head in the pool
    cache.evict(100)
    assert cache.match_prefix(tokens).indices.numel() == 24
    got = cache.match_and_load(tokens)
    # the block [16, 32) straddles the pool's head and the evicted tail: [24, 32) comes back
    assert got.indices.numel() == 32 and got.host_tokens == 8
    assert torch.equal(got.indices[:24], head)
    check_kv_accounting(pool, cache, rows, [])


def test_the_host_tier_drops_its_least_recently_used_blocks():
    cache, pool, rows = _cache("auto", 1, pool_tokens=64, host_blocks=2)
    docs = [[d + 1] * 16 for d in range(3)]
    for doc in docs:
        cache.insert(doc, _fill(pool, doc))
        cache.evict(16)
    assert len(cache.host) == 2 and cache.host.stats.evicted_blocks == 1
    assert cache.match_and_load(docs[0]).host_tokens == 0  # the oldest was dropped
    assert cache.match_and_load(docs[2]).host_tokens == 16
    check_kv_accounting(pool, cache, rows, [])


def test_a_load_never_takes_a_locked_prefix_and_stops_when_the_pool_is_full():
    cache, pool, rows = _cache("auto", 1, pool_tokens=64)
    doc = list(range(1, 33))
    cache.insert(doc, _fill(pool, doc))
    cache.evict(32)
    other = [50] * 64
    cache.insert(other, _fill(pool, other))
    cache.inc_lock_ref(cache.match_prefix(other).last_node)  # the whole pool, locked
    got = cache.match_and_load(doc)
    assert got.indices.numel() == 0 and got.host_tokens == 0
    check_kv_accounting(pool, cache, rows, [])


@pytest.mark.parametrize("host_kv", ["int8", "fp8_e4m3"])
def test_a_compressed_host_tier_gives_back_what_the_pools_quantization_would_hold(host_kv):
    """--hicache-host-kv-dtype: a block comes back as the pool's own --kv-cache-dtype
    quantization of it would read (dequantized to the pool dtype), not bit for bit."""
    fmt = resolve_kv_cache_format(host_kv, torch.bfloat16)
    pool = TokenToKVPool(96, 1, LAYERS, HEADS, DIM, torch.bfloat16)
    rows = ReqToTokenPool(2, 256)
    host = HostKVTier(16, 16, compression=HostCompression(fmt, torch.bfloat16))
    cache = HiRadixCache(rows, pool, 1, host)
    tokens = list(range(1, 33))
    slots = _fill(pool, tokens)
    exact = pool.read_slots(slots)
    cache.insert(tokens, slots)
    cache.evict(32)
    stored = next(iter(host._blocks.values()))
    assert stored.k.element_size() == 1 and stored.k_scale is not None  # one byte a value
    got = cache.match_and_load(tokens)
    assert got.host_tokens == 32
    back = pool.read_slots(got.indices)
    assert back.k.dtype == torch.bfloat16 and back.k_scale is None
    for x, y in ((exact.k, back.k), (exact.v, back.v)):
        q, scale = quantize_kv(x, fmt, torch.bfloat16)
        assert torch.equal(y, dequantize_kv(q, scale, torch.bfloat16))  # the pool format's
        err = (x.float() - y.float()).abs().amax().item()
        assert 0 < err < 0.1 * x.float().abs().amax().item()
    check_kv_accounting(pool, cache, rows, [])
