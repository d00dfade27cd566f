"""A tiny random Llama whose decoder layers run RadixGen's Triton fused ops (add + RMSNorm,
rotary + KV store, SiLU-mul) gives the torch layers' logits and greedy tokens (float32).

Runs on CPU under Triton's interpreter only (scripts/test_triton_cpu.sh): the model, KV pool
and attention stay on CPU tensors, and only the layer ops differ between the two runners. The
same kernels are checked natively on CUDA by test/kernels/test_triton_fused_ops.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_harness import Session, build_hf_model, random_ids, save_hf_model, tiny_config

from radixgen.kernels.attention.torch_backend import TorchAttentionBackend
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.server_args import ServerArgs

INTERPRETING = not torch.cuda.is_available()  # conftest skips it on CPU without the interpreter
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.triton_interpret,
    pytest.mark.skipif(not INTERPRETING, reason="CPU tensors under Triton's interpreter only"),
]
TOLERANCE = 2e-5  # float32: the ops differ from torch in summation order and exp/sqrt bits


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's attention shape (9 heads over 3 KV heads of 64) at a tiny width."""
    config = tiny_config(
        "llama_gqa", hidden_size=72, num_attention_heads=9, num_key_value_heads=3, head_dim=64
    )
    return save_hf_model(build_hf_model(config, seed=7), tmp_path_factory.mktemp("gqa64"))


def runner_with_layer_ops(folder: Path, fused: bool) -> ModelRunner:
    """A float32 runner on the torch attention backend, its layers on the Triton fused ops
    (fused) or on the torch ops."""
    from radixgen.kernels.triton.fused_ops import TritonFusedOps

    args = ServerArgs.from_kwargs(dtype="float32", max_total_tokens=4096)
    runner = ModelRunner(str(folder), args, context_length=1000)
    runner.model.prepack(TritonFusedOps() if fused else None, None)
    runner.attn_backend = TorchAttentionBackend(
        runner.kv_pool, runner.req_to_token_pool, native=None
    )
    return runner


def test_greedy_tokens_with_the_fused_ops_equal_the_torch_layers(gqa_model: Path) -> None:
    ours = Session(runner_with_layer_ops(gqa_model, fused=True))
    oracle = Session(runner_with_layer_ops(gqa_model, fused=False))
    prompts = [random_ids(n, seed=300 + n) for n in (11, 5, 1)]
    slots = [(ours.new_request(), oracle.new_request()) for _ in prompts]
    # step 1: the three prompts in one extend; then decode steps over all three
    chunks = list(enumerate(prompts))
    tokens: list[list[int]] = [[] for _ in prompts]
    for _ in range(6):
        got = ours.step([(slots[r][0], toks) for r, toks in chunks])
        want = oracle.step([(slots[r][1], toks) for r, toks in chunks])
        nxt = []
        for (r, _), a, b in zip(chunks, got, want, strict=True):
            torch.testing.assert_close(a, b, atol=TOLERANCE * b.abs().max().item(), rtol=0)
            token = int(a[-1].argmax())
            assert token == int(b[-1].argmax())
            tokens[r].append(token)
            nxt.append((r, [token]))
        chunks = nxt
    assert all(len(t) == 6 for t in tokens)
