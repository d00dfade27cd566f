"""Tiny random-weight Hugging Face models built in code, and a driver for our ModelRunner.

Shared by the model tests: nothing is downloaded. Weights are re-drawn with a large spread after
`from_config` (HF zero-inits biases and one-inits norms, and its 0.02 init makes attention nearly
uniform), so biases, norms, rope and attention masks all visibly change the logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

from radixgen.kernels.attention.torch_backend import TorchAttentionBackend
from radixgen.kernels.step_cancel import CancelFlag
from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.server_args import ServerArgs

VOCAB = 512
_BASE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 10000.0,
}
LINEAR_ROPE = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}

# name -> (config class, overrides). head_dim 16 takes the native kernel's AVX-512 path,
# head_dim 8 (8 heads) its scalar path.
VARIANTS: dict[str, tuple[type, dict[str, Any]]] = {
    "llama_gqa": (LlamaConfig, {}),
    "llama_mqa": (LlamaConfig, dict(num_key_value_heads=1)),
    "llama_mha_bias": (
        LlamaConfig,
        dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True),
    ),
    "llama3_rope": (LlamaConfig, dict(rope_parameters=LLAMA3_ROPE)),
    "llama_linear_rope": (LlamaConfig, dict(rope_parameters=LINEAR_ROPE, num_hidden_layers=3)),
    "mistral": (MistralConfig, dict(sliding_window=None, head_dim=16)),
    "mistral_window": (MistralConfig, dict(sliding_window=7, head_dim=16)),
    "qwen2_tied": (Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen2_untied_hd8": (
        Qwen2Config,
        dict(tie_word_embeddings=False, num_attention_heads=8, num_key_value_heads=2),
    ),
    "qwen2_window_layers": (
        Qwen2Config,
        dict(use_sliding_window=True, sliding_window=6, max_window_layers=1, num_hidden_layers=3),
    ),
}


def tiny_config(variant: str, **overrides: Any) -> Any:
    """A transformers config for one of `VARIANTS`, with extra overrides."""
    cls, extra = VARIANTS[variant]
    return cls(**{**_BASE, **extra, **overrides})


def build_hf_model(config: Any, seed: int = 0) -> Any:
    """HF model from `config` with every parameter redrawn (weights N(0, 0.15), norms ~1)."""
    torch.manual_seed(seed)
    # NOTE: soft-capped attention logits (Gemma 2) only in transformers' eager attention: some
    # versions pick sdpa for it, which drops the cap (transformers 5.17 on the GPU machine did)
    kwargs = (
        {"attn_implementation": "eager"} if getattr(config, "attn_logit_softcapping", None) else {}
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.15 * noise)
    return model.eval()


def save_hf_model(model: Any, folder: Path, max_shard_size: str | None = None) -> Path:
    """save_pretrained as safetensors (sharded when `max_shard_size` is small)."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(folder), safe_serialization=True, **kwargs)
    return folder


@torch.no_grad()
def hf_logits(model: Any, ids: Sequence[int]) -> torch.Tensor:
    """Float32 logits of HF's full-sequence forward: [len(ids), V]."""
    return model(torch.tensor([list(ids)])).logits[0].float()


def make_runner(folder: Path, dtype: str = "float32", native: bool = True) -> ModelRunner:
    """Our ModelRunner on `folder`; `native=False` swaps in the pure-torch decode attention."""
    args = ServerArgs.from_kwargs(dtype=dtype, max_total_tokens=4096)
    runner = ModelRunner(str(folder), args, context_length=1000)
    if native:
        assert runner.attn_backend.native is not None, "native decode kernel did not build"
    else:
        runner.attn_backend = TorchAttentionBackend(
            runner.kv_pool, runner.req_to_token_pool, native=None
        )
        runner.graph_runner = None  # its graphs were captured with the replaced backend
    return runner


@dataclass
class Session:
    """Drives a ModelRunner like the scheduler does: each request keeps a slot and a prefix."""

    runner: ModelRunner
    prefix: dict[int, int] = field(default_factory=dict)

    def new_request(self) -> int:
        slot = self.runner.req_to_token_pool.alloc()
        assert slot is not None
        self.prefix[slot] = 0
        return slot

    def step(
        self,
        chunks: Sequence[tuple[int, Sequence[int]]],
        lora_ids: Sequence[str | None] | None = None,
        cancel: CancelFlag | None = None,
    ) -> list[torch.Tensor]:
        """One forward over several requests' new tokens -> each chunk's logits [n_i, V].

        lora_ids: each chunk's LoRA adapter (None: the base model), as the scheduler sets them.
        cancel: the step's cancel flag (a cut step raises StepCancelled; its prefixes stay)."""
        ids, positions, slots_list, prefixes, lens, starts = [], [], [], [], [], []
        locs = self.runner.kv_pool.alloc(sum(len(c) for _, c in chunks))
        assert locs is not None
        offset = 0
        for slot, new in chunks:
            n, pre = len(new), self.prefix[slot]
            loc = locs[offset : offset + n]
            self.runner.req_to_token_pool.write_row(slot, pre, loc)  # both tables (on CUDA)
            ids += list(new)
            positions += range(pre, pre + n)
            slots_list.append(slot)
            prefixes.append(pre)
            lens.append(n)
            starts.append(offset)
            offset += n
        batch = ForwardBatch(
            torch.tensor(ids),
            torch.tensor(positions),
            locs,
            slots_list,
            prefixes,
            lens,
            starts,
            None,
        )
        if lora_ids is not None and any(n is not None for n in lora_ids):
            batch.lora_ids = list(lora_ids)
        batch.cancel = cancel
        logits = self.runner.forward(batch).rows_float(slice(None))
        for slot, new in chunks:
            self.prefix[slot] += len(new)
        return [logits[s : s + n] for s, n in zip(starts, lens, strict=True)]


def max_rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |ours - ref| relative to the reference logits' scale (max |ref|)."""
    return float((ours.float().to(ref.device) - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def random_ids(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=gen).tolist()
