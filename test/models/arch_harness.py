"""Tiny random configs of the newer architectures and a batched greedy driver for our runner.

Shared by the architecture tests (test_arch_parity.py, test_arch_gguf.py): nothing is
downloaded; models come from `model_harness.build_hf_model` (every weight redrawn).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from model_harness import _BASE as LLAMA_SHAPE
from model_harness import Session
from transformers import (
    Gemma2Config,
    MixtralConfig,
    Phi3Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)

from radixgen.runtime.model_executor.model_runner import ModelRunner

# the Llama harness's tiny shape; these configs want no pad token
_BASE: dict[str, Any] = {**LLAMA_SHAPE, "pad_token_id": None}
PHI3_ORIG_CTX = 24  # longrope: short factors up to here, long ones past it
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.15 * i for i in range(8)],
    "long_factor": [1.5 + 0.9 * i for i in range(8)],
    "original_max_position_embeddings": PHI3_ORIG_CTX,
    "rope_theta": 10000.0,
}
GEMMA2_WINDOW = 8

# name -> (config class, overrides)
ARCH_VARIANTS: dict[str, tuple[type, dict[str, Any]]] = {
    "qwen3": (Qwen3Config, dict(head_dim=16, tie_word_embeddings=False)),
    "qwen3_tied_bias_hd8": (
        Qwen3Config,
        dict(head_dim=8, num_attention_heads=8, attention_bias=True, tie_word_embeddings=True),
    ),
    "mixtral": (
        MixtralConfig,
        dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=None),
    ),
    "mixtral_top1_window": (
        MixtralConfig,
        dict(num_local_experts=3, num_experts_per_tok=1, head_dim=16, sliding_window=7),
    ),
    "qwen2_moe": (
        Qwen2MoeConfig,
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            norm_topk_prob=False,
        ),
    ),
    "qwen2_moe_norm_dense_layer": (
        Qwen2MoeConfig,
        dict(
            num_experts=6,
            num_experts_per_tok=3,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=40,
            norm_topk_prob=True,
            mlp_only_layers=[1],
            num_hidden_layers=3,
        ),
    ),
    "qwen3_moe": (
        Qwen3MoeConfig,
        dict(
            head_dim=16,
            num_experts=5,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            norm_topk_prob=True,
            decoder_sparse_step=2,
            num_hidden_layers=3,
        ),
    ),
    "phi3_longrope": (
        Phi3Config,
        dict(
            max_position_embeddings=256,
            rope_parameters=LONGROPE,
            original_max_position_embeddings=PHI3_ORIG_CTX,
        ),
    ),
    "phi3": (Phi3Config, dict(max_position_embeddings=1024, tie_word_embeddings=False)),
    "gemma2": (
        Gemma2Config,
        dict(
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=GEMMA2_WINDOW,
            attn_logit_softcapping=4.0,
            final_logit_softcapping=6.0,
            num_hidden_layers=3,
        ),
    ),
}


def arch_config(variant: str, **overrides: Any) -> Any:
    cls, extra = ARCH_VARIANTS[variant]
    return cls(**{**_BASE, **extra, **overrides})


@torch.no_grad()
def hf_greedy(model: Any, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """transformers' own greedy `generate` (its KV cache), exactly `new_tokens` tokens: no
    end-of-sequence stop (the random model may pick the eos id; our driver does not stop)."""
    model.generation_config.eos_token_id = None
    out = model.generate(
        torch.tensor([list(prompt)]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=new_tokens,
        pad_token_id=0,
    )
    return list(out[0, len(prompt) :].tolist())


def our_greedy(
    runner: ModelRunner, prompts: Sequence[Sequence[int]], new_tokens: int
) -> list[list[int]]:
    """All prompts prefilled in one step, then decoded together, greedy, through the runner."""
    session = Session(runner)
    slots = [session.new_request() for _ in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    step = [(s, list(p)) for s, p in zip(slots, prompts, strict=True)]
    for _ in range(new_tokens):
        logits = session.step(step)
        step = []
        for i, (slot, rows) in enumerate(zip(slots, logits, strict=True)):
            token = int(rows[-1].argmax())
            outs[i].append(token)
            step.append((slot, [token]))
    return outs


def arch_runner(folder: Any, native: bool = True, dtype: str = "float32") -> ModelRunner:
    """`make_runner` for these architectures: with `native`, the native layer ops (and native
    attention unless the model soft-caps attention logits, which the torch path serves)."""
    from model_harness import make_runner

    if not native:
        return make_runner(folder, dtype, native=False)
    from radixgen.server_args import ServerArgs

    args = ServerArgs.from_kwargs(dtype=dtype, max_total_tokens=4096)
    runner = ModelRunner(str(folder), args, context_length=1000)
    assert runner.native is not None, "native kernels did not build"
    softcapped = runner.cfg.attn_logit_softcapping is not None
    assert (runner.attn_backend.native is None) == softcapped
    return runner
