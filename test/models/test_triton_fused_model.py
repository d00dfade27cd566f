"""A tiny random Llama whose decoder layers run RadixGen's Triton fused ops (add + RMSNorm,
rotary + KV store, SiLU-mul) gives the torch layers' logits and greedy tokens.

On CPU under Triton's interpreter (scripts/test_triton_cpu.sh): float32, the model, KV pool and
torch attention on CPU tensors, the ops attached by hand, so only the layer ops differ. On a
CUDA machine: the model runner's own choice on `--device cuda` (its `select_gpu_fused_ops`
hook) against the same runner with the torch layer ops, in float32 and bf16 (skipped while the
runner refuses CUDA).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_harness import Session, build_hf_model, random_ids, save_hf_model, tiny_config

from radixgen.kernels.attention.torch_backend import TorchAttentionBackend
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.server_args import ServerArgs

pytestmark = [pytest.mark.gpu, pytest.mark.triton_interpret]

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = ["float32", "bfloat16"]
# max |ours - torch| relative to the logits' scale: float32 differs in summation order and
# exp/sqrt bits only; bf16 by an occasional one-ulp rounding, carried through the layers
TOLERANCE = {"float32": 2e-5, "bfloat16": 5e-2}
NEAR_TIE = 1e-2  # top-2 logit gap under which greedy choices may differ (bf16)


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's attention shape (9 heads over 3 KV heads of 64) at a tiny width."""
    config = tiny_config(
        "llama_gqa", hidden_size=72, num_attention_heads=9, num_key_value_heads=3, head_dim=64
    )
    return save_hf_model(build_hf_model(config, seed=7), tmp_path_factory.mktemp("gqa64"))


def runner_with_layer_ops(folder: Path, dtype: str, fused: bool) -> ModelRunner:
    """A runner whose decoder layers use the Triton fused ops (fused) or the torch ops."""
    from radixgen.kernels.triton.fused_ops import TritonFusedOps

    args = ServerArgs.from_kwargs(device=DEVICE, dtype=dtype, max_total_tokens=4096)
    runner = ModelRunner(str(folder), args, context_length=1000)
    if ON_GPU:  # the runner's own choice, through its hook
        assert isinstance(runner.layer_ops, TritonFusedOps)
        if not fused:
            runner.model.prepack(None, None)
        return runner
    # NOTE: the runner's GEMM: its linear layers hold only their packed weights now
    runner.model.prepack(TritonFusedOps() if fused else None, runner.linear_gemm)
    runner.attn_backend = TorchAttentionBackend(
        runner.kv_pool, runner.req_to_token_pool, native=None
    )
    return runner


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_tokens_with_the_fused_ops_equal_the_torch_layers(
    gqa_model: Path, dtype: str
) -> None:
    ours = Session(runner_with_layer_ops(gqa_model, dtype, fused=True))
    oracle = Session(runner_with_layer_ops(gqa_model, dtype, fused=False))
    prompts = [random_ids(n, seed=300 + n) for n in (11, 5, 1)]
    slots = [(ours.new_request(), oracle.new_request()) for _ in prompts]
    # step 1: the three prompts in one extend; then decode steps over all three, both runners
    # fed the torch layers' greedy tokens
    chunks = list(enumerate(prompts))
    near_ties = 0
    for _ in range(6):
        got = ours.step([(slots[r][0], toks) for r, toks in chunks])
        want = oracle.step([(slots[r][1], toks) for r, toks in chunks])
        nxt = []
        for (r, _), a, b in zip(chunks, got, want, strict=True):
            scale = b.abs().max().item()
            torch.testing.assert_close(a, b, atol=TOLERANCE[dtype] * scale, rtol=0)
            top2 = b[-1].topk(2).values
            token = int(b[-1].argmax())
            if int(a[-1].argmax()) != token:
                assert dtype == "bfloat16" and float(top2[0] - top2[1]) < NEAR_TIE, r
                near_ties += 1
            nxt.append((r, [token]))
        chunks = nxt
    assert near_ties <= 2
