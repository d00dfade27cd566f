"""Decoder embedding models on our decoder stack: last-token pooling of one prefill matches
transformers' last hidden state (tiny random Llama and Qwen2 built here), batched as alone."""

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
    # nothing is kept: every row and slot went back
    assert runner.runner.kv_pool.available_size() == runner.runner.kv_pool.size


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
