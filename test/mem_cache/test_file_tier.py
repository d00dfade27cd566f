"""The HiCache file tier: entries written atomically and read back bit for bit, re-indexed by a
new process (a restart), corrupt / truncated / foreign entries never served, a size cap with
least-recently-used deletion, and each write policy writing when it says."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from radixgen.kernels.kv_quant import resolve_kv_cache_format
from radixgen.runtime.mem_cache.file_tier import (
    FileKVTier,
    decode_block,
    encode_block,
    kv_validity_digest,
)
from radixgen.runtime.mem_cache.hiradix_cache import HiRadixCache
from radixgen.runtime.mem_cache.host_tier import HostKVTier
from radixgen.runtime.mem_cache.memory_pool import KVBlock, ReqToTokenPool, TokenToKVPool
from radixgen.runtime.scheduler.accounting import check_kv_accounting

LAYERS, HEADS, DIM = 2, 2, 8
DIGEST = kv_validity_digest({"model": "toy"})


def _block(seed: int, scaled: bool = False) -> KVBlock:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(LAYERS, 16, HEADS, DIM, generator=g).to(torch.bfloat16)
    v = torch.randn(LAYERS, 16, HEADS, DIM, generator=g).to(torch.bfloat16)
    scale = torch.rand(LAYERS, 16, HEADS, generator=g) if scaled else None
    return KVBlock(k, v, scale, scale)


def _same(a: KVBlock, b: KVBlock) -> bool:
    pairs = [(a.k, b.k), (a.v, b.v), (a.k_scale, b.k_scale), (a.v_scale, b.v_scale)]
    return all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in pairs
    )


@pytest.mark.parametrize("scaled", [False, True])
def test_an_entry_round_trips_and_a_new_tier_on_the_directory_finds_it(tmp_path, scaled):
    tier = FileKVTier(tmp_path, 1 << 30, DIGEST)
    tier.put(b"k" * 16, _block(1, scaled))
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # renamed into place
    again = FileKVTier(tmp_path, 1 << 30, DIGEST)  # a restart
    got = again.get(b"k" * 16)
    assert got is not None and _same(got, _block(1, scaled))
    other = FileKVTier(tmp_path, 1 << 30, kv_validity_digest({"model": "other"}))
    assert len(other) == 0 and other.get(b"k" * 16) is None  # another model's KV: not ours


def _entry(tmp_path: Path) -> Path:
    (path,) = [p for p in tmp_path.iterdir() if p.suffix == ".kv"]
    return path


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "garbage"])
def test_a_bad_entry_is_skipped_and_removed(tmp_path, damage):
    FileKVTier(tmp_path, 1 << 30, DIGEST).put(b"k" * 16, _block(2))
    path = _entry(tmp_path)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-5] ^= 0xFF
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "foreign":  # another digest's entry under our name
        raw = bytearray(encode_block(kv_validity_digest({"x": 1}), b"k" * 16, _block(2)))
    else:
        raw = bytearray(b"not an entry")
    path.write_bytes(bytes(raw))
    tier = FileKVTier(tmp_path, 1 << 30, DIGEST)
    assert tier.get(b"k" * 16) is None
    assert tier.bad_entries == 1 and not path.exists() and len(tier) == 0


def test_decode_refuses_another_key():
    raw = encode_block(DIGEST, b"a" * 16, _block(3))
    assert decode_block(raw, DIGEST, b"a" * 16) is not None
    assert decode_block(raw, DIGEST, b"b" * 16) is None


def test_the_size_cap_deletes_the_least_recently_used_entries(tmp_path):
    size = len(encode_block(DIGEST, b"0" * 16, _block(0)))
    tier = FileKVTier(tmp_path, 3 * size, DIGEST)
    for i in range(3):
        tier.put(bytes([i]) * 16, _block(i))
    assert tier.get(bytes([0]) * 16) is not None  # used: now the most recent
    tier.put(bytes([3]) * 16, _block(3))
    assert len(tier) == 3 and bytes([1]) * 16 not in tier and bytes([0]) * 16 in tier
    assert len(list(tmp_path.glob("*.kv"))) == 3 and tier.used_bytes == 3 * size
    smaller = FileKVTier(tmp_path, 2 * size, DIGEST)  # a restart under a smaller cap
    assert len(smaller) == 2 and len(list(tmp_path.glob("*.kv"))) == 2


def _cache(tmp_path: Path, policy: str, host_blocks: int = 8, kv: str = "auto"):
    fmt = resolve_kv_cache_format(kv, torch.float32)
    pool = TokenToKVPool(96, 1, LAYERS, HEADS, DIM, torch.float32, kv_format=fmt)
    rows = ReqToTokenPool(2, 256)
    files = FileKVTier(tmp_path, 1 << 30, DIGEST)
    cache = HiRadixCache(rows, pool, 1, HostKVTier(host_blocks, 16), files, policy)
    return cache, pool, rows


def _fill(pool: TokenToKVPool, n: int, seed: int) -> torch.Tensor:
    slots = pool.alloc(n)
    assert slots is not None
    g = torch.Generator().manual_seed(seed)
    for layer in range(LAYERS):
        pool.set_kv(
            layer,
            slots,
            torch.randn(n, HEADS, DIM, generator=g),
            torch.randn(n, HEADS, DIM, generator=g),
        )
    return slots


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_write_through_serves_a_prefix_after_a_restart_bit_for_bit(tmp_path, kv):
    cache, pool, _ = _cache(tmp_path, "write_through", kv=kv)
    tokens = list(range(1, 41))
    slots = _fill(pool, 40, seed=5)
    before = pool.read_slots(slots[:32])
    cache.insert(tokens, slots)
    assert len(cache.files) == 2  # written as the tree took it, no eviction needed
    restarted, pool2, rows2 = _cache(tmp_path, "write_through", kv=kv)
    got = restarted.match_and_load([*tokens, 7])
    assert got.indices.numel() == 32 and got.storage_tokens == 32 and got.host_tokens == 0
    assert _same(pool2.read_slots(got.indices), before)
    check_kv_accounting(pool2, restarted, rows2, [])
    restarted.evict(100)  # now in the host tier too: the next load comes from there
    again = restarted.match_and_load(tokens)
    assert again.host_tokens == 32 and again.storage_tokens == 0


def test_write_through_selective_writes_what_the_pool_evicts(tmp_path):
    cache, pool, _ = _cache(tmp_path, "write_through_selective")
    cache.insert(list(range(1, 33)), _fill(pool, 32, seed=6))
    assert len(cache.files) == 0
    cache.evict(32)
    assert len(cache.files) == 2 and len(cache.host) == 2


def test_write_back_writes_what_the_host_tier_drops(tmp_path):
    cache, pool, rows = _cache(tmp_path, "write_back", host_blocks=2)
    for d in range(3):
        cache.insert([d + 1] * 32, _fill(pool, 32, seed=d))
        cache.evict(32)
    assert len(cache.host) == 2 and len(cache.files) == 4  # the 4 blocks the host dropped
    got = cache.match_and_load([1] * 32)  # dropped from the host tier, read from the file
    assert got.storage_tokens == 32
    check_kv_accounting(pool, cache, rows, [])


def test_a_corrupt_entry_is_recomputed_not_served(tmp_path):
    cache, pool, _ = _cache(tmp_path, "write_through")
    cache.insert(list(range(1, 33)), _fill(pool, 32, seed=7))
    for path in tmp_path.glob("*.kv"):
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0x01
        path.write_bytes(bytes(raw))
    restarted, _, _ = _cache(tmp_path, "write_through")
    got = restarted.match_and_load(list(range(1, 33)))
    assert got.indices.numel() == 0 and restarted.files is not None
    assert restarted.files.bad_entries == 1  # the first block failed: nothing after it is read


def test_flush_empties_the_file_tier_unless_asked_to_keep_it(tmp_path):
    cache, pool, _ = _cache(tmp_path, "write_through")
    cache.insert(list(range(1, 33)), _fill(pool, 32, seed=8))
    cache.reset(keep_lower_tiers=True)
    pool.clear()
    assert len(cache.files) == 2
    cache.reset()
    assert len(cache.files) == 0 and not list(tmp_path.glob("*.kv"))


def test_two_servers_sharing_a_directory_never_serve_a_broken_entry(tmp_path):
    """Two tiers on one directory (two servers): the same key written by both is one whole
    entry; an entry one of them deleted (its size cap) is a miss for the other, not an error."""
    a = FileKVTier(tmp_path, 1 << 30, DIGEST)
    b = FileKVTier(tmp_path, 1 << 30, DIGEST)
    a.put(b"s" * 16, _block(4))
    b.put(b"s" * 16, _block(4))  # b's index did not know it: rewritten whole, same content
    b.put(b"t" * 16, _block(5))
    got = a.get(b"s" * 16)
    assert got is not None and _same(got, _block(4))
    assert len(list(tmp_path.glob("*.kv"))) == 2 and not list(tmp_path.glob("*.tmp"))
    b.clear()  # removes both files a may have indexed
    assert a.get(b"s" * 16) is None and len(a) == 0 and a.bad_entries == 0
    assert FileKVTier(tmp_path, 1 << 30, DIGEST).get(b"t" * 16) is None
