"""HiCache (`--enable-hierarchical-cache`) in the scheduler, with the toy runner on a small pool:
prefixes evicted from the pool come back from the host tier instead of being prefilled, and
every output still equals the toy model's reference (which breaks if a loaded block were wrong,
shifted or shared), with the KV accounting checked after every step (`debug_invariants`).
"""

from __future__ import annotations

import tempfile

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toy_runner import make_scheduler, reference_output, run_to_end, submit

from radixgen.runtime.mem_cache.hiradix_cache import HiRadixCache
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.mem_cache.radix_cache import RadixCache
from radixgen.runtime.scheduler.scheduler_process import create_prefix_cache
from radixgen.server_args import ServerArgs

DOCS = [[(7 * d + 3 * i) % 45 + 2 for i in range(64)] for d in range(4)]  # 64-token documents


def _run(s, rid: str, prompt: list[int], n: int = 4) -> list[int]:
    submit(s, rid, prompt, max_new_tokens=n)
    out = run_to_end(s)
    assert out[rid][0] == reference_output(prompt, n)
    return out[rid][0]


def test_flag_off_builds_the_plain_tree_and_on_the_tiered_one():
    off, _ = make_scheduler(pool_tokens=256)
    on, _ = make_scheduler(pool_tokens=256, enable_hierarchical_cache=True)
    assert type(off.cache) is RadixCache
    assert isinstance(on.cache, HiRadixCache)
    assert on.cache.host.capacity_tokens() == 512  # --hicache-ratio 2.0 of the pool, in blocks


def test_an_evicted_prefix_is_loaded_back_from_the_host_tier():
    s, runner = make_scheduler(pool_tokens=128, enable_hierarchical_cache=True)
    _run(s, "a", [*DOCS[0], 1])
    _run(s, "b", [*DOCS[1], 1])  # 2 x 69 tokens > 128: DOCS[0] is evicted to the host tier
    assert s.cache.host.stats.stored_blocks >= 4
    assert s.cache.match_prefix(DOCS[0]).indices.numel() < 64  # gone from the pool
    _run(s, "a2", [*DOCS[0], 5])
    req_batch = runner.batches[-4]  # the admission's prefill
    assert req_batch.prefix_lens == [64] and req_batch.extend_lens == [1]
    assert s.stats.host_cached_tokens > 0
    host = s.internal_state().tiers.host
    assert host is not None and host.host_hit_tokens == s.stats.host_cached_tokens
    assert host.host_used_tokens > 0


def test_without_the_flag_the_evicted_prefix_is_prefilled_again():
    s, runner = make_scheduler(pool_tokens=128)
    _run(s, "a", [*DOCS[0], 1])
    _run(s, "b", [*DOCS[1], 1])
    _run(s, "a2", [*DOCS[0], 5])
    assert runner.batches[-4].prefix_lens[0] < 64
    state = s.internal_state()
    assert state.tiers.host is None and "host_hit_tokens" not in state.as_dict()


def test_flush_empties_the_host_tier_too():
    s, _ = make_scheduler(pool_tokens=128, enable_hierarchical_cache=True)
    _run(s, "a", [*DOCS[0], 1])
    _run(s, "b", [*DOCS[1], 1])
    assert len(s.cache.host) > 0
    assert s.flush_cache().success
    assert len(s.cache.host) == 0


def test_a_compressed_host_tier_is_sized_by_its_own_bytes_per_token():
    """--hicache-ratio is of memory: an int8 host tier over a bf16 pool of head dim 64 holds
    ~1.9x the tokens (64 + a 4-byte scale against 128 bytes a head); over the toy's float32
    pool of head dim 1 it holds fewer (1 + 4 bytes against 4)."""
    args = ServerArgs.from_kwargs(
        max_total_tokens=256, enable_hierarchical_cache=True, hicache_host_kv_dtype="int8"
    )
    pool = TokenToKVPool(256, 1, 2, 2, 64, torch.bfloat16)
    cache = create_prefix_cache(args, ReqToTokenPool(2, 64), pool)
    assert isinstance(cache, HiRadixCache)
    assert cache.host.capacity_tokens() == 512 * 128 // 68 // 16 * 16  # 960: 1.88x of 512
    plain, _ = make_scheduler(pool_tokens=256, enable_hierarchical_cache=True)
    packed, _ = make_scheduler(
        pool_tokens=256, enable_hierarchical_cache=True, hicache_host_kv_dtype="int8"
    )
    assert plain.cache.host.capacity_tokens() == 512
    assert packed.cache.host.capacity_tokens() == 512 * 4 // 5 // 16 * 16


requests = st.lists(
    st.tuples(
        st.integers(0, len(DOCS) - 1),  # which document
        st.integers(0, 64),  # how much of it
        st.lists(st.integers(1, 49), max_size=6),  # a question after it
        st.integers(1, 6),  # tokens to generate
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    waves=st.lists(requests, min_size=1, max_size=4),
    page_size=st.sampled_from([1, 4, 8]),
    pool=st.sampled_from([96, 160]),
    host_ratio=st.sampled_from([0.5, 2.0]),
)
def test_eviction_storms_give_the_reference_outputs(waves, page_size, pool, host_ratio):
    """Waves of requests over shared documents on a pool that holds about one of them: every
    wave evicts, the host tier (small or large, its own LRU) serves some, recompute the rest."""
    s, _ = make_scheduler(
        pool_tokens=pool,
        page_size=page_size,
        enable_hierarchical_cache=True,
        hicache_ratio=host_ratio,
        max_running_requests=4,
    )
    for w, wave in enumerate(waves):
        expected = {}
        for i, (doc, cut, question, n) in enumerate(wave):
            prompt = [*DOCS[doc][:cut], *question] or [1]
            rid = f"w{w}r{i}"
            submit(s, rid, prompt, max_new_tokens=n)
            expected[rid] = reference_output(prompt, n)
        out = run_to_end(s)
        assert {rid: ids for rid, (ids, _) in out.items()} == expected
    s.check_invariants()
    assert s.stats.host_cached_tokens <= s.stats.cached_tokens


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    waves=st.lists(requests, min_size=1, max_size=3),
    page_size=st.sampled_from([1, 4]),
    policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
    host_ratio=st.sampled_from([0.25, 1.0]),
)
def test_file_tier_storms_and_a_restart_give_the_reference_outputs(
    waves, page_size, policy, host_ratio
):
    """The same storms over host and file tiers, then a new scheduler on the same directory
    (a restart) serves the last wave again, from disk where it can."""
    with tempfile.TemporaryDirectory() as d:
        flags = dict(
            pool_tokens=96,
            page_size=page_size,
            enable_hierarchical_cache=True,
            hicache_ratio=host_ratio,
            hicache_storage_backend="file",
            hicache_file_dir=d,
            hicache_write_policy=policy,
            max_running_requests=4,
        )
        s, _ = make_scheduler(**flags)
        for w, wave in enumerate(waves):
            assert _run_wave(s, f"w{w}", wave)
        restarted, _ = make_scheduler(**flags)
        assert _run_wave(restarted, "again", waves[-1])
        restarted.check_invariants()
        st_ = restarted.stats
        assert st_.host_cached_tokens + st_.storage_cached_tokens <= st_.cached_tokens


def _run_wave(s, tag: str, wave) -> bool:
    expected = {}
    for i, (doc, cut, question, n) in enumerate(wave):
        prompt = [*DOCS[doc][:cut], *question] or [1]
        submit(s, f"{tag}r{i}", prompt, max_new_tokens=n)
        expected[f"{tag}r{i}"] = reference_output(prompt, n)
    out = run_to_end(s)
    return {rid: ids for rid, (ids, _) in out.items()} == expected


def test_a_restart_serves_a_document_from_the_file_tier(tmp_path):
    flags = dict(
        pool_tokens=256,
        enable_hierarchical_cache=True,
        hicache_storage_backend="file",
        hicache_file_dir=str(tmp_path),
    )
    s, _ = make_scheduler(**flags)
    _run(s, "a", [*DOCS[0], 1])  # write-through: on disk with no eviction at all
    restarted, runner = make_scheduler(**flags)
    _run(restarted, "a2", [*DOCS[0], 9])
    assert runner.batches[0].prefix_lens == [64]
    assert restarted.stats.storage_cached_tokens == 64
    storage = restarted.internal_state().tiers.storage
    assert storage is not None and storage.storage_hit_tokens == 64


def test_a_pinned_prompt_outlives_the_host_tiers_lru():
    """`pin_prefix` (a DSL prefix hint): the prompt's blocks go to the host tier at once and stay
    while other documents, more than the tier holds, pass through the pool and the tier; an
    unpinned document of the same size has left both by then."""
    from radixgen.io_struct import TokenizedGenerateReq
    from radixgen.sampling_params import SamplingParams

    docs = [[(7 * d + 3 * i) % 45 + 2 for i in range(64)] for d in range(8)]
    s, runner = make_scheduler(pool_tokens=128, enable_hierarchical_cache=True, hicache_ratio=1.0)
    host = s.cache.host
    assert host.capacity_tokens() == 128  # 8 blocks: the pinned 4 and room for 4 more
    sp = SamplingParams.from_dict({"max_new_tokens": 0, "temperature": 0})
    s.add_request(TokenizedGenerateReq("pin", docs[0], sp, pin_prefix=True))
    run_to_end(s)
    tier = s.internal_state().tiers.host
    assert host.pinned_tokens() == 64 and tier is not None and tier.host_pinned_tokens == 64
    for d in range(1, 8):
        _run(s, f"d{d}", [*docs[d], 1])
    assert host.pinned_tokens() == 64 and host.stats.evicted_blocks > 0
    _run(s, "pin-again", [*docs[0], 5])
    assert runner.batches[-4].prefix_lens == [64]  # all of it back from the host tier
    _run(s, "d1-again", [*docs[1], 5])
    assert runner.batches[-4].prefix_lens[0] < 64  # the unpinned one was dropped


def test_host_tier_pins_leave_last_and_oldest_first():
    from radixgen.runtime.mem_cache.host_tier import HostKVTier
    from radixgen.runtime.mem_cache.memory_pool import KVBlock

    def block(i: int) -> KVBlock:
        return KVBlock(torch.full((1, 2, 1, 1), float(i)), torch.zeros(1, 2, 1, 1))

    dropped: list[bytes] = []
    tier = HostKVTier(3, 2, on_drop=lambda k, b: dropped.append(k))
    tier.put(b"p1", block(1), pinned=True)
    tier.put(b"a", block(2))
    assert tier.pin(b"a") and not tier.pin(b"zz")  # pinned in place
    tier.put(b"b", block(3))
    tier.put(b"c", block(4))  # full: the one unpinned block goes
    assert dropped == [b"b"] and tier.pinned_tokens() == 4
    tier.put(b"p2", block(5), pinned=True)  # c, unpinned, goes before any pin
    assert dropped == [b"b", b"c"] and tier.pinned_tokens() == 6
    tier.put(b"d", block(6))  # only pins left: the oldest, p1, gives way
    assert dropped == [b"b", b"c", b"p1"]
    assert b"a" in tier and b"p2" in tier and b"d" in tier
    a = tier.get(b"a")
    assert a is not None and a.k[0, 0, 0, 0] == 2.0
    tier.clear()
    assert len(tier) == 0 and tier.pinned_tokens() == 0
