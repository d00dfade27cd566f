"""HiCache end to end on the real default model with a small KV pool: a document's prefix
evicted from the pool comes back from the host tier, and greedy outputs are identical whether
the prefix came from the pool, the host tier or a recompute (KV accounting checked after every
step by `debug_invariants`)."""

from __future__ import annotations

import pytest

import radixgen

pytestmark = pytest.mark.slow  # starts an Engine

GREEDY = {"temperature": 0, "max_new_tokens": 8}


def _doc(topic: str) -> str:
    facts = ". ".join(f"Fact {i}: the {topic} number {i} is {i * 7 % 13}" for i in range(12))
    return f"Read about {topic}. {facts}.\nQuestion: what is the {topic} number 5?\nAnswer:"


DOC_A, DOC_B = _doc("river"), _doc("mountain")


@pytest.fixture(
    scope="module",
    params=[{}, {"page_size": 4, "kv_cache_dtype": "int8"}],
    ids=["page1-auto", "page4-int8"],
)
def engine(request):
    with radixgen.Engine(
        **request.param,
        enable_hierarchical_cache=True,
        max_total_tokens=320,  # one document and its answer, not two
        grammar_backend="none",
        debug_invariants=True,
        log_level="warning",
    ) as eng:
        yield eng


def _gen(eng, prompt: str) -> tuple[list[int], dict]:
    out = eng.generate(prompt, GREEDY)
    return out["output_ids"], out["meta_info"]


def test_outputs_are_identical_from_pool_host_tier_and_recompute(engine):
    engine.flush_cache()
    cold, meta = _gen(engine, DOC_A)  # computed
    assert meta["cached_tokens"] == 0
    assert meta["cached_tokens_details"] == {"device": 0, "host": 0, "storage": 0}
    assert meta["prompt_tokens"] > 170  # two do not fit in the pool beside their answers
    pool, meta = _gen(engine, DOC_A)  # from the pool
    assert meta["cached_tokens_details"]["device"] >= meta["prompt_tokens"] - 1
    _gen(engine, DOC_B)  # evicts DOC_A's prefix to the host tier
    host, meta = _gen(engine, DOC_A)
    assert meta["cached_tokens_details"]["host"] >= 128, meta
    assert meta["cached_tokens"] == sum(meta["cached_tokens_details"].values())
    assert cold == pool == host
    state = engine.get_server_info()["internal_states"][0]
    assert state["host_hit_tokens"] >= 128 and state["host_stored_blocks"] > 0
    engine.flush_cache()  # every tier: recomputed again
    again, meta = _gen(engine, DOC_A)
    assert meta["cached_tokens"] == 0 and again == cold


def _file_engine(folder) -> radixgen.Engine:
    return radixgen.Engine(
        enable_hierarchical_cache=True,
        hicache_storage_backend="file",
        hicache_file_dir=str(folder),
        max_total_tokens=320,
        grammar_backend="none",
        debug_invariants=True,
        log_level="warning",
    )


def test_a_restart_serves_the_prefix_from_the_file_tier_and_skips_corrupt_entries(tmp_path):
    with _file_engine(tmp_path) as eng:
        cold, meta = _gen(eng, DOC_A)  # computed, written through to the directory
    assert meta["cached_tokens"] == 0
    entries = sorted(tmp_path.glob("*.kv"))
    assert len(entries) == meta["prompt_tokens"] // 16
    with _file_engine(tmp_path) as eng:  # a restart on the same directory
        warm, meta = _gen(eng, DOC_A)
        state = eng.get_server_info()["internal_states"][0]
    assert meta["cached_tokens_details"]["storage"] >= 160, meta
    assert warm == cold
    assert state["storage_hit_tokens"] == meta["cached_tokens_details"]["storage"]
    for path in tmp_path.glob("*.kv"):  # corrupt every entry's payload
        raw = bytearray(path.read_bytes())
        raw[-3] ^= 0x5A
        path.write_bytes(bytes(raw))
    with _file_engine(tmp_path) as eng:
        again, meta = _gen(eng, DOC_A)
        state = eng.get_server_info()["internal_states"][0]
    assert meta["cached_tokens"] == 0 and state["storage_bad_entries"] == 1
    assert again == cold


def test_an_int8_host_tier_reports_its_agreement_with_the_exact_outputs():
    """--hicache-host-kv-dtype int8 is lossy (the pool's int8 --kv-cache-dtype quantization of
    the evicted prefix): greedy outputs served from it are compared with the exact cold ones
    and the agreement printed, as the --kv-cache-dtype tests do."""
    docs = [_doc(t) for t in ("river", "mountain", "forest", "desert")]
    with radixgen.Engine(
        enable_hierarchical_cache=True,
        hicache_host_kv_dtype="int8",
        max_total_tokens=320,
        grammar_backend="none",
        debug_invariants=True,
        log_level="warning",
    ) as eng:
        cold = [_gen(eng, d)[0] for d in docs]  # each evicts the one before to the host tier
        served = [_gen(eng, d) for d in docs]
    assert all(meta["cached_tokens_details"]["host"] >= 128 for _, meta in served)
    agree = sum(out == ref for (out, _), ref in zip(served, cold, strict=True))
    first = sum(out[:4] == ref[:4] for (out, _), ref in zip(served, cold, strict=True))
    print(f"int8 host tier: {agree}/{len(docs)} greedy 8-token outputs identical, {first} on 4")
    assert first >= len(docs) - 1
