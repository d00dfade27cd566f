"""Grouped MoE experts against a per-token loop: one SparseMoeBlock forward at several token
counts, same weights, same routing.

"grouped" is the model's path (runtime/layers/moe.py: pairs sorted by expert, each expert one
prepacked MLP call over its tokens); "per_token" is the baseline the design rules out: for every
token, one MLP call per chosen expert. Both produce the same rows (checked).

    python benchmark/bench_moe.py [--tokens 1 8 64 256] [--dtype bfloat16] [--repeats 5] [--threads 1]

Prints one JSON line per (dtype, tokens) with both times and per_token/grouped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from radixgen.kernels.cpu import select_linear_gemm, select_native_kernels
from radixgen.runtime.layers.mlp import MLP
from radixgen.runtime.layers.moe import SparseMoeBlock
from radixgen.runtime.models.model_config import ModelArchConfig

CONFIG = {
    "architectures": ["MixtralForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 1,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


def per_token(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(block.gate.forward(x).float(), dim=-1)
    weights, experts = torch.topk(probs, block.top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros((x.shape[0], x.shape[1]), dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(block.top_k):
            e = int(experts[t, j])
            out[t] += weights[t, j] * block.experts[e].forward(x[t : t + 1])[0].float()
    return out.to(x.dtype)


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a shared machine: 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    cfg = ModelArchConfig.from_dict(CONFIG)
    torch.manual_seed(0)
    block = SparseMoeBlock(cfg)
    for p in block.parameters():
        p.data = (0.05 * torch.randn(p.shape)).to(dtype)
    native = select_native_kernels("cpu", dtype)
    gemm = select_linear_gemm(native)
    for module in block.modules():  # as CausalLM.prepack does
        if hasattr(module, "prepack"):
            module.prepack(gemm)
        if isinstance(module, MLP):
            module.native = native
    for n in args.tokens:
        x = torch.randn(n, cfg.hidden_size).to(dtype)
        assert torch.allclose(block.forward(x).float(), per_token(block, x).float(), atol=2e-2)
        grouped = timed(lambda x=x: block.forward(x), args.repeats)
        loop = timed(lambda x=x: per_token(block, x), args.repeats)
        print(json.dumps({
            "bench": "moe_experts", "dtype": args.dtype, "tokens": n,
            "grouped_ms": round(grouped * 1e3, 3), "per_token_ms": round(loop * 1e3, 3),
            "per_token_over_grouped": round(loop / grouped, 2), "native_gemm": gemm is not None,
        }))  # fmt: skip


if __name__ == "__main__":
    main()
