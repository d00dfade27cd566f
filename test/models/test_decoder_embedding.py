"""Decoder embedding models on our decoder stack: last-token pooling of one prefill matches
transformers' last hidden state (tiny random Llama and Qwen2 built here), batched as alone; with
the radix tree, prompts that share a prefix reuse its KV and give the vectors (and reranker
scores) of a runner that keeps nothing, through eviction when the pool is small."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_harness import build_hf_model, random_ids, save_hf_model, tiny_config

from radixgen.runtime.model_executor.decoder_embedding_runner import DecoderEmbeddingRunner
from radixgen.runtime.model_executor.embedding_runner import EmbeddingJob
from radixgen.server_args import ServerArgs

COSINE_MIN = 0.9999


@pytest.mark.parametrize("variant", ["llama_gqa", "qwen2_tied"])
def test_last_token_pooling_matches_transformers(variant: str, tmp_path: Path) -> None:
    hf = build_hf_model(tiny_config(variant))
    folder = save_hf_model(hf, tmp_path)
    args = ServerArgs.from_kwargs(dtype="float32", max_total_tokens=4096)
    runner = DecoderEmbeddingRunner(folder, args, None)
    assert (runner.pooling.mode, runner.pooling.normalize) == ("last", True)

    seqs = [random_ids(n, seed) for seed, n in enumerate([13, 1, 40, 7])]
    batched = torch.stack(runner.embed([EmbeddingJob(s) for s in seqs]))
    alone = torch.stack([runner.embed([EmbeddingJob(s)])[0] for s in seqs])
    want = []
    for s in seqs:
        with torch.no_grad():
            states = hf.model(input_ids=torch.tensor([s])).last_hidden_state
        want.append(torch.nn.functional.normalize(states[0, -1].float(), dim=-1))
    cos = torch.nn.functional.cosine_similarity(batched, torch.stack(want), dim=-1)
    assert cos.min().item() >= COSINE_MIN, cos
    torch.testing.assert_close(alone, batched, rtol=0, atol=1e-5)
    # Matryoshka: the first 8 values, normalised again
    short = runner.embed([EmbeddingJob(seqs[0], 8)])[0]
    torch.testing.assert_close(short, torch.nn.functional.normalize(batched[0, :8], dim=-1))
    # what is kept is the tree's, unlocked; a flush gives every slot back
    _check_accounting(runner)
    runner.flush_cache()
    assert runner.runner.kv_pool.available_size() == runner.runner.kv_pool.size


def _assert_matches_hf(hf, seqs: list[list[int]], got: torch.Tensor) -> None:
    """Each vector is the HF model's normalised last hidden state of its sequence."""
    for i, s in enumerate(seqs):
        with torch.no_grad():
            states = hf.model(input_ids=torch.tensor([s])).last_hidden_state
        ref = torch.nn.functional.normalize(states[0, -1].float(), dim=-1)
        assert torch.nn.functional.cosine_similarity(got[i], ref, dim=0) >= COSINE_MIN


def _check_accounting(runner: DecoderEmbeddingRunner) -> None:
    """Between batches: every slot is free or held, unlocked, by the tree."""
    pool, cache = runner.runner.kv_pool, runner.cache
    held = 0 if cache is None else cache.evictable_size()
    assert cache is None or cache.protected_size() == 0
    assert pool.available_size() + held == pool.size
    if cache is not None:
        cache.check_invariants()
        in_tree = {int(i) for t in cache.cached_slots() for i in t.tolist()}
        assert len(in_tree) == held and not in_tree & pool.free_slot_set()


def _shared_prefix_prompts(prefix_len: int, seed: int) -> list[list[int]]:
    """An instruction-like prefix, then suffixes of different lengths (one twice, one empty but
    for its last token), in an order the sort does not keep."""
    prefix = random_ids(prefix_len, seed)
    tails = [random_ids(n, seed + 1 + n) for n in (9, 1, 23, 4, 9)]
    return [prefix + t for t in tails] + [random_ids(12, seed + 99)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_shared_prefixes_reuse_kv_and_give_the_vectors_without_reuse(
    page_size: int, tmp_path: Path
) -> None:
    hf = build_hf_model(tiny_config("llama_gqa"))
    folder = save_hf_model(hf, tmp_path)
    kw = dict(dtype="float32", max_total_tokens=4096, page_size=page_size)
    cached = DecoderEmbeddingRunner(folder, ServerArgs.from_kwargs(**kw), None)
    plain = DecoderEmbeddingRunner(
        folder, ServerArgs.from_kwargs(**kw, disable_radix_cache=True), None
    )
    assert cached.cache is not None and plain.cache is None
    seqs = _shared_prefix_prompts(60, 1)
    jobs = [EmbeddingJob(s) for s in seqs]
    want = torch.stack(plain.embed(jobs))
    got = torch.stack(cached.embed(jobs))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # one pass computes the first of the five in sorted order; the other four reuse its prefix
    # (the page-aligned part of it), the duplicate all but its last token
    aligned = 60 - 60 % page_size
    assert cached.cached_tokens >= 4 * aligned, cached.cached_tokens
    per_job = cached.last_cached_tokens  # what each request's meta_info reports
    assert sum(per_job) == cached.cached_tokens and per_job[-1] == 0  # the unrelated prompt
    assert sorted(per_job[:5])[0] == 0 and all(n >= aligned for n in sorted(per_job[:5])[1:])
    assert plain.cached_tokens == 0
    _check_accounting(cached)
    # asked again, each reuses all but its last token (whole pages of it)
    before = cached.cached_tokens
    again = torch.stack(cached.embed(jobs))
    torch.testing.assert_close(again, want, rtol=0, atol=1e-5)
    reused = [(len(s) - 1) - (len(s) - 1) % page_size for s in seqs]
    assert cached.cached_tokens - before == sum(reused) and cached.last_cached_tokens == reused
    _check_accounting(cached)
    _assert_matches_hf(hf, seqs, got)  # and the exact model agrees


def test_a_small_pool_evicts_cached_prefixes_and_stays_exact(tmp_path: Path) -> None:
    hf = build_hf_model(tiny_config("qwen2_tied"))
    folder = save_hf_model(hf, tmp_path)
    kw = dict(dtype="float32", max_total_tokens=192)
    cached = DecoderEmbeddingRunner(folder, ServerArgs.from_kwargs(**kw), None)
    plain = DecoderEmbeddingRunner(
        folder, ServerArgs.from_kwargs(**kw, disable_radix_cache=True), None
    )
    assert cached.cache is not None
    evict, freed = cached.cache.evict, []

    def counting_evict(n: int) -> int:  # the real eviction, counted
        freed.append(evict(n))
        return freed[-1]

    cached.cache.evict = counting_evict  # type: ignore[method-assign]
    # prompt sets of 258 tokens (more than the pool: embed cuts them into groups that fit), 89
    # once their prefix is shared: one asked twice finds its own; three do not fit together
    for seed in (1, 1, 2, 3, 1, 3):
        jobs = [EmbeddingJob(s) for s in _shared_prefix_prompts(40, seed)]
        torch.testing.assert_close(
            torch.stack(cached.embed(jobs)), torch.stack(plain.embed(jobs)), rtol=0, atol=1e-5
        )
        _check_accounting(cached)
    assert sum(freed) > 0 and cached.cached_tokens > 0, (freed, cached.cached_tokens)


def test_reranker_scores_are_the_same_with_the_query_prefix_reused(tmp_path: Path) -> None:
    hf = build_hf_model(tiny_config("llama_gqa"))
    folder = save_hf_model(hf, tmp_path)
    kw = dict(dtype="float32", max_total_tokens=4096)
    cached = DecoderEmbeddingRunner(folder, ServerArgs.from_kwargs(**kw), None, (5, 9))
    plain = DecoderEmbeddingRunner(
        folder, ServerArgs.from_kwargs(**kw, disable_radix_cache=True), None, (5, 9)
    )
    template_and_query = random_ids(48, 7)
    prompts = [template_and_query + random_ids(n, 30 + n) + [11, 12] for n in (5, 17, 2, 30)]
    jobs = [EmbeddingJob(p) for p in prompts]
    got = torch.stack(cached.embed(jobs))
    torch.testing.assert_close(got, torch.stack(plain.embed(jobs)), rtol=0, atol=1e-5)
    assert cached.cached_tokens >= 3 * 48


def test_yes_no_reranker_scores_match_transformers(tmp_path: Path) -> None:
    hf = build_hf_model(tiny_config("llama_gqa"))
    folder = save_hf_model(hf, tmp_path)
    args = ServerArgs.from_kwargs(dtype="float32", max_total_tokens=4096)
    yes, no = 5, 9
    runner = DecoderEmbeddingRunner(folder, args, None, (yes, no))
    assert runner.is_cross_encoder and runner.hidden_size == 1
    prompts = [random_ids(n, 10 + n) for n in (17, 4, 30)]
    got = torch.stack(runner.embed([EmbeddingJob(p) for p in prompts]))[:, 0]
    for row, p in enumerate(prompts):
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([p])).logits[0, -1].float()
        want = torch.softmax(logits[[yes, no]], dim=-1)[0]
        torch.testing.assert_close(got[row], want, rtol=1e-4, atol=1e-5)


def test_a_second_pass_only_where_it_reuses_whole_pages(tmp_path: Path) -> None:
    folder = save_hf_model(build_hf_model(tiny_config("llama_gqa")), tmp_path)
    runner = DecoderEmbeddingRunner(
        folder, ServerArgs.from_kwargs(dtype="float32", max_total_tokens=4096, page_size=64), None
    )
    shared = random_ids(40, 3)  # under one page: the tree could give none of it back
    seqs = [shared + random_ids(5, 4), shared + random_ids(7, 5)]
    assert len(runner._passes(seqs)) == 1
    longer = random_ids(130, 6)  # two whole pages shared: the second prompt waits for them
    seqs = [longer + random_ids(5, 7), longer + random_ids(9, 8), random_ids(50, 9)]
    first, second = runner._passes(seqs)
    assert len(second) == 1 and sorted(first + second) == [0, 1, 2]
    runner.embed([EmbeddingJob(s) for s in seqs])
    assert sorted(runner.last_cached_tokens) == [0, 0, 128]


@pytest.mark.parametrize("radix", [True, False])
def test_long_inputs_prefill_in_chunks_and_give_the_same_vectors(
    radix: bool, tmp_path: Path
) -> None:
    hf = build_hf_model(tiny_config("llama_gqa"))
    folder = save_hf_model(hf, tmp_path)
    kw = dict(dtype="float32", max_total_tokens=4096, disable_radix_cache=not radix)
    whole = DecoderEmbeddingRunner(
        folder, ServerArgs.from_kwargs(**kw, chunked_prefill_size=-1), None
    )
    chunked = DecoderEmbeddingRunner(
        folder, ServerArgs.from_kwargs(**kw, chunked_prefill_size=16), None
    )
    forward, sizes = chunked.runner.model.forward, []

    def counting_forward(input_ids, positions, batch):  # the real forward, its sizes counted
        sizes.append(len(input_ids))
        return forward(input_ids, positions, batch)

    chunked.runner.model.forward = counting_forward  # type: ignore[method-assign]
    seqs = [*_shared_prefix_prompts(60, 5), random_ids(5, 77)]  # 60..83 tokens, and a short one
    jobs = [EmbeddingJob(s) for s in seqs]
    want = torch.stack(whole.embed(jobs))
    got = torch.stack(chunked.embed(jobs))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    computed = sum(len(s) for s in seqs) - chunked.cached_tokens
    assert max(sizes) == 16 and sum(sizes) == computed, sizes  # no forward over 16 tokens
    _check_accounting(chunked)
    _assert_matches_hf(hf, seqs, got)  # and the exact model agrees
