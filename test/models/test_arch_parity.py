"""Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE, Phi-3 and Gemma 2 through our ModelRunner against
transformers.

Float32, tiny random models saved as safetensors: every logit row of a batched schedule
(prefill, extend on a cached prefix, decode, mixed steps) matches HF's full forward, and
batched greedy decoding equals HF's own `generate` token for token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from arch_harness import (
    ARCH_VARIANTS,
    GEMMA2_WINDOW,
    LONGROPE,
    PHI3_ORIG_CTX,
    arch_config,
    arch_runner,
    hf_greedy,
    our_greedy,
)
from model_harness import Session, build_hf_model, hf_logits, max_rel_err, random_ids, save_hf_model
from test_hf_parity import FP32_TOL, SCHEDULE

from radixgen.runtime.models.model_config import ModelArchConfig


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, tuple[Any, Path]] = {}

    def get(variant: str) -> tuple[Any, Path]:
        if variant not in cache:
            model = build_hf_model(arch_config(variant), seed=3 + len(cache))
            cache[variant] = (model, save_hf_model(model, tmp_path_factory.mktemp(variant)))
        return cache[variant]

    return get


@torch.no_grad()
def hf_chunked_logits(model: Any, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """HF's logits when the sequence arrives in `chunks` through its own KV cache.

    NOTE: the reference for longrope: transformers picks short or long factors by the length
    seen so far, so a sequence crossing the original context mid-way keeps the keys it cached
    with short factors (its full forward would use long factors throughout)."""
    from transformers import DynamicCache

    cache, outs, done = DynamicCache(), [], 0
    for n in chunks:
        out = model(torch.tensor([ids[done : done + n]]), past_key_values=cache, use_cache=True)
        outs.append(out.logits[0].float())
        done += n
    return torch.cat(outs)


def schedule_error(model: Any, folder: Path, native: bool) -> float:
    """Worst relative logit error of the batched SCHEDULE against HF's full forward (for
    longrope: HF fed the same chunks)."""
    n_req = 1 + max(r for step in SCHEDULE for r, _ in step)
    totals = [sum(n for step in SCHEDULE for r, n in step if r == i) for i in range(n_req)]
    seqs = [random_ids(t, seed=200 + i) for i, t in enumerate(totals)]
    scaling = model.config.rope_parameters or {}
    if scaling.get("rope_type") == "longrope":
        assert max(totals) > PHI3_ORIG_CTX > min(n for step in SCHEDULE for _, n in step)
        refs = [
            hf_chunked_logits(model, s, [n for step in SCHEDULE for r, n in step if r == i])
            for i, s in enumerate(seqs)
        ]
    else:
        refs = [hf_logits(model, s) for s in seqs]
    session = Session(arch_runner(folder, native))
    slots = [session.new_request() for _ in seqs]
    done = [0] * n_req
    worst = 0.0
    for step in SCHEDULE:
        chunks = [(slots[r], seqs[r][done[r] : done[r] + n]) for r, n in step]
        for (r, n), out in zip(step, session.step(chunks), strict=True):
            worst = max(worst, max_rel_err(out, refs[r][done[r] : done[r] + n]))
            done[r] += n
    return worst


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("variant", sorted(ARCH_VARIANTS))
def test_fp32_logits_match_hf(saved: Any, variant: str, native: bool) -> None:
    model, folder = saved(variant)
    assert schedule_error(model, folder, native) < FP32_TOL


# prompt lengths: Gemma 2's window is 8 (all but the first exceed it); Phi-3's longrope switches
# to long factors past 24 tokens: 5 + 14 and 9 + 14 stay short, 30 starts long.
# NOTE: a Phi-3 request crossing 24 mid-generation is not compared with `generate` here: there
# transformers drops its cache and recomputes every key with long factors, while we (like vLLM
# and SGLang) keep the cached keys and switch for new tokens; the logits test compares that
# case with HF fed the same chunks.
PROMPT_LENS = (5, 17, 30)
LONGROPE_PROMPT_LENS = (5, 9, 30)
NEW_TOKENS = 14


@pytest.mark.parametrize("variant", sorted(ARCH_VARIANTS))
def test_batched_greedy_equals_hf_generate(saved: Any, variant: str) -> None:
    model, folder = saved(variant)
    lens = LONGROPE_PROMPT_LENS if variant == "phi3_longrope" else PROMPT_LENS
    prompts = [random_ids(n, seed=300 + n) for n in lens]
    want = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    got = our_greedy(arch_runner(folder, native=True), prompts, NEW_TOKENS)
    assert got == want
    assert len({tuple(w) for w in want}) == len(want)  # the prompts lead different ways


@pytest.mark.parametrize(
    ("variant", "plain"),
    [
        ("gemma2", {"attn_logit_softcapping": None}),
        ("gemma2", {"final_logit_softcapping": None}),
        ("gemma2", {"sliding_window": 4096}),
        ("gemma2", {"query_pre_attn_scalar": 16}),
        ("phi3_longrope", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
        ("qwen2_moe_norm_dense_layer", {"norm_topk_prob": False}),
    ],
)
def test_features_are_visible(variant: str, plain: dict[str, Any]) -> None:
    """Guard: each feature moves these models' logits far beyond the tolerance (40 tokens: past
    Gemma 2's window and Phi-3's original context)."""
    assert max(GEMMA2_WINDOW, PHI3_ORIG_CTX) < 40
    ids = random_ids(40, seed=1)
    with_feature = hf_logits(build_hf_model(arch_config(variant)), ids)
    without = hf_logits(build_hf_model(arch_config(variant, **plain)), ids)
    assert max_rel_err(without, with_feature) > 100 * FP32_TOL


def test_configs_parse(saved: Any) -> None:
    cfg = ModelArchConfig.from_folder(saved("gemma2")[1])
    assert cfg.layer_sliding_windows == (GEMMA2_WINDOW, None, GEMMA2_WINDOW)
    assert cfg.attn_logit_softcapping == 4.0 and cfg.final_logit_softcapping == 6.0
    assert cfg.query_pre_attn_scalar == 24 and cfg.hidden_act == "gelu_pytorch_tanh"
    cfg = ModelArchConfig.from_folder(saved("qwen2_moe_norm_dense_layer")[1])
    assert cfg.moe is not None and cfg.moe.sparse_layers == (True, False, True)
    assert cfg.moe.renormalize and cfg.moe.shared_expert_intermediate_size == 40 and cfg.qkv_bias
    cfg = ModelArchConfig.from_folder(saved("mixtral_top1_window")[1])
    assert cfg.moe is not None and cfg.moe.top_k == 1 and cfg.layer_sliding_windows == (7, 7)
    cfg = ModelArchConfig.from_folder(saved("phi3_longrope")[1])
    assert cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "longrope"
    assert cfg.rope_scaling["original_max_position_embeddings"] == PHI3_ORIG_CTX
    assert cfg.rope_scaling["attention_factor"] > 1.0
    cfg = ModelArchConfig.from_folder(saved("qwen3_moe")[1])
    assert cfg.moe is not None and cfg.moe.sparse_layers == (False, True, False)
    assert cfg.moe.num_experts == 5 and cfg.moe.renormalize and cfg.qk_norm
    cfg = ModelArchConfig.from_folder(saved("qwen3")[1])
    assert cfg.qk_norm and not cfg.qkv_bias and cfg.head_dim == 16


def test_longrope_rows_of_a_draft_are_those_of_its_decode_steps(saved: Any) -> None:
    """Phi-3's long factors start past the original context: a prompt chunk reads them when its
    request's sequence is longer, a speculative draft's tokens (verified in one extend) when
    each token's own position is, as the decode steps they stand for do; so speculation changes
    no greedy output across the boundary."""
    from radixgen.runtime.layers.rotary import LongRopeRotaryEmbedding
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.models.model_config import ModelArchConfig

    rotary = LongRopeRotaryEmbedding(ModelArchConfig.from_folder(saved("phi3_longrope")[1]), 64)
    orig, long = PHI3_ORIG_CTX, 64  # a long row reads position + max_positions

    def rows(prefix: list[int], extend: list[int], drafts: list[bool] | None) -> list[int]:
        pos = torch.tensor([p + k for p, e in zip(prefix, extend, strict=True) for k in range(e)])
        batch = ForwardBatch(
            pos, pos, pos, list(range(len(prefix))), prefix, extend, [], None, draft_rows=drafts
        )
        return rotary.table_rows(pos, batch).tolist()

    decode = [rows([p], [1], None)[0] for p in range(orig - 3, orig + 2)]
    assert decode == [orig - 3, orig - 2, orig - 1, orig + long, orig + 1 + long]
    # a draft row from position orig - 3 over the boundary, beside a prompt chunk ending past it
    both = rows([0, orig - 3], [orig + 1, 5], [False, True])
    chunk, draft = both[: orig + 1], both[orig + 1 :]
    assert chunk == [p + long for p in range(orig + 1)]  # its sequence is longer: all long
    assert draft == decode
    # without the flag the draft row would read the long half for all five tokens
    assert rows([orig - 3], [5], None) == [p + long for p in range(orig - 3, orig + 2)]


def test_bf16_runs_close_to_hf(saved: Any) -> None:
    """bf16 (native GEMM and kernels where the CPU has them) stays near HF's float32 at every
    position; MoE models may flip one expert at a router near-tie (HF's own bf16 does too), so
    there one position in 30 may stray."""
    for variant in ("qwen3", "mixtral", "qwen2_moe", "phi3_longrope", "gemma2"):
        model, folder = saved(variant)
        ids = random_ids(30, seed=5)
        session = Session(arch_runner(folder, native=True, dtype="bfloat16"))
        slot = session.new_request()
        (out,) = session.step([(slot, ids)])
        ref = hf_logits(model, ids)
        errs = (out - ref).abs().max(dim=-1).values / ref.abs().max()
        allowed = 1 if "moe" in variant or "mixtral" in variant else 0
        assert int((errs > 0.1).sum()) <= allowed, (variant, errs.tolist())
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("variant", ["mixtral", "qwen2_moe", "qwen3", "phi3_longrope", "gemma2"])
def test_rows_are_batch_invariant_in_bf16(saved: Any, variant: str) -> None:
    """A request's bf16 logits are bitwise the same alone or batched with others: for MoE
    models although its tokens then share expert groups with other tokens (each expert: one
    prepacked GEMM pair over its group), for Gemma 2 through the pure-torch attention."""
    from radixgen.kernels.cpu import select_linear_gemm

    _, folder = saved(variant)
    runner = arch_runner(folder, native=True, dtype="bfloat16")
    if select_linear_gemm(runner.native) is None:
        pytest.skip("no native bf16 GEMM on this CPU (oneDNN rows vary with the batch)")
    prompt, others = random_ids(20, seed=8), [random_ids(n, seed=9 + n) for n in (13, 27)]
    alone = our_logits(runner, [prompt])[0]
    batched = our_logits(arch_runner(folder, native=True, dtype="bfloat16"), [prompt, *others])
    assert all(torch.equal(a, b) for a, b in zip(alone, batched[0], strict=True))


def our_logits(runner: Any, prompts: list[list[int]], steps: int = 4) -> list[list[torch.Tensor]]:
    """Each prompt's last-row logits after its prefill and after each greedy decode step."""
    session = Session(runner)
    slots = [session.new_request() for _ in prompts]
    rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    step = [(s, p) for s, p in zip(slots, prompts, strict=True)]
    for _ in range(steps):
        outs = session.step(step)
        step = []
        for i, (slot, out) in enumerate(zip(slots, outs, strict=True)):
            rows[i].append(out[-1])
            step.append((slot, [int(out[-1].argmax())]))
    return rows


def test_softcapping_backends(saved: Any) -> None:
    """Gemma 2 soft-caps attention logits: auto picks torch on CPU and triton on CUDA,
    flashinfer is refused with the reason, and on CPU the runner's attention takes the
    pure-torch path (the native kernel has no soft-capping)."""
    from radixgen.errors import InvalidRequestError
    from radixgen.runtime.model_executor.resolution import resolve_attention_backend

    _, folder = saved("gemma2")
    cfg = ModelArchConfig.from_folder(folder)
    assert resolve_attention_backend("auto", "cuda", cfg, torch.bfloat16) == "triton"
    assert resolve_attention_backend("auto", "cpu", cfg) == "torch"
    assert resolve_attention_backend("triton", "cuda", cfg, torch.bfloat16) == "triton"
    with pytest.raises(InvalidRequestError, match="flashinfer has no attention logit soft"):
        resolve_attention_backend("flashinfer", "cuda", cfg, torch.bfloat16)
    plain = ModelArchConfig.from_folder(saved("qwen3")[1])
    assert resolve_attention_backend("flashinfer", "cuda", plain) == "flashinfer"
    assert arch_runner(folder, native=True).attn_backend.native is None


@pytest.mark.parametrize(
    ("variant", "edit", "message"),
    [
        ("gemma2", {"hidden_activation": "gelu"}, "hidden_act 'gelu' is not supported for gemma2"),
        ("mixtral", {"num_experts_per_tok": 9}, "num_experts_per_tok 9 must be in 1..4"),
        (
            "gemma2",
            {"attn_logit_softcapping": -1.0},
            "attn_logit_softcapping must be a positive number",
        ),
        (
            "phi3_longrope",
            {"rope_parameters": {**LONGROPE, "long_factor": [1.0, 2.0]}},
            "needs long_factor with 8 values",
        ),
        ("qwen3", {"rope_parameters": LONGROPE}, "'longrope' is not supported for qwen3"),
    ],
)
def test_bad_arch_configs_are_refused(
    saved: Any, variant: str, edit: dict[str, Any], message: str
) -> None:
    import json

    from radixgen.errors import InvalidRequestError

    raw = json.loads((saved(variant)[1] / "config.json").read_text())
    with pytest.raises(InvalidRequestError, match=message):
        ModelArchConfig.from_dict({**raw, **edit})
