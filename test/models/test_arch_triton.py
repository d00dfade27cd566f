"""The triton attention backend runs Gemma 2 (attention logit soft-capping, alternating sliding
window) and Qwen3 to transformers' float32 logits (`gpu` tests; on CPU under Triton's
interpreter: scripts/test_triton_cpu.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest
from arch_harness import arch_config
from model_harness import Session, build_hf_model, hf_logits, max_rel_err, random_ids, save_hf_model

from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.server_args import ServerArgs

# prefill past Gemma 2's window of 8, a chunk on the cached prefix, decode rows mixed with a prefill
SCHEDULE = [[(0, 20)], [(0, 12)], [(0, 1), (1, 16)], [(0, 1), (1, 1)], [(1, 1), (0, 1)]]


# Gemma 2 whole, and without its soft-capping (whether a failure is about it)
CASES = [
    ("gemma2", {}),
    ("gemma2", {"attn_logit_softcapping": None}),
    ("qwen3", {}),
]


@pytest.mark.gpu
@pytest.mark.triton_interpret
@pytest.mark.parametrize(("variant", "overrides"), CASES)
def test_triton_backend_matches_hf(tmp_path: Path, variant: str, overrides: dict) -> None:
    model = build_hf_model(arch_config(variant, **overrides), seed=41)
    folder = save_hf_model(model, tmp_path / variant)
    args = ServerArgs.from_kwargs(
        dtype="float32", max_total_tokens=4096, attention_backend="triton"
    )
    runner = ModelRunner(str(folder), args, context_length=1000)
    assert type(runner.attn_backend).__name__ == "TritonAttentionBackend"
    totals = [sum(n for step in SCHEDULE for r, n in step if r == i) for i in range(2)]
    seqs = [random_ids(t, seed=60 + i) for i, t in enumerate(totals)]
    refs = [hf_logits(model, s) for s in seqs]
    session = Session(runner)
    slots = [session.new_request() for _ in seqs]
    done = [0, 0]
    for i, step in enumerate(SCHEDULE):
        outs = session.step([(slots[r], seqs[r][done[r] : done[r] + n]) for r, n in step])
        for (r, n), out in zip(step, outs, strict=True):
            ref = refs[r][done[r] : done[r] + n]
            rows = [round(max_rel_err(out[j], ref[j]), 6) for j in range(n)]
            assert max_rel_err(out, ref) < 1e-4, (variant, overrides, "step", i, "request", r, rows)
            done[r] += n
