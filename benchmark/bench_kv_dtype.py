"""KV cache dtype (`--kv-cache-dtype`): int8 and fp8_e4m3 against bf16, in one run.

For each quantized dtype on the default model: (a) accuracy: greedy first 16 tokens of 12
varied prompts against the bf16-KV engine (prompts that agree on all 16) and the mean |logprob|
difference over the positions before the first disagreement; (b) capacity: tokens a fixed KV
budget holds, from the running pool's bytes per token (scales counted); (c) single-stream decode
tok/s at a long context (a ~2k-token prompt, cached, then `--decode-tokens` decode steps), where
the KV reads matter: the three engines stay up together and are measured in alternation,
`--rounds` times each (the median is reported).

    python benchmark/bench_kv_dtype.py [--quick] [--budget-gib 1] [--context 2048]

Prints one JSON line per result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from typing import Any

import radixgen

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain gravity to a child in two sentences.",
    "Translate 'good morning' into Spanish.",
    "What is 17 plus 25?",
    "Name a famous physicist and say why they matter.",
    "Give me a tip for learning to cook.",
    "Describe a rainy day in a city.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet in one sentence.",
]
NEW_TOKENS = 16
DTYPES = ("bf16", "int8", "fp8_e4m3")


def emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


def greedy(engine: Any, prompts: list[str]) -> list[tuple[list[int], list[float]]]:
    outs = engine.generate(
        prompts, {"temperature": 0, "max_new_tokens": NEW_TOKENS}, return_logprob=True
    )
    return [
        (o["output_ids"], [lp for lp, _id, _t in o["meta_info"]["output_token_logprobs"]])
        for o in outs
    ]


def agreement(
    base: list[tuple[list[int], list[float]]], other: list[tuple[list[int], list[float]]]
) -> tuple[int, float]:
    """(prompts whose first NEW_TOKENS ids agree, mean |logprob diff| before each divergence)."""
    same, diffs = 0, []
    for (ids_a, lps_a), (ids_b, lps_b) in zip(base, other, strict=True):
        k = 0
        while k < min(len(ids_a), len(ids_b)) and ids_a[k] == ids_b[k]:
            diffs.append(abs(lps_a[k] - lps_b[k]))
            k += 1
        same += ids_a[:NEW_TOKENS] == ids_b[:NEW_TOKENS]
    return same, sum(diffs) / max(1, len(diffs))


def long_prompt(tokenizer: Any, tokens: int) -> str:
    text, i = "", 0
    while len(tokenizer.encode(text)) < tokens - 40:
        text += " ".join(
            f"Record {j}: the value of item {j} is {j * 7 % 101}." for j in range(i, i + 20)
        )
        text += "\n"
        i += 20
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{text}\nWhich item has value 42?"}]
    )


def decode_rate(engine: Any, prompt: str, steps: int) -> float:
    """Decode tok/s on a cached long prompt (the first request caches it)."""
    engine.generate(prompt, {"temperature": 0, "max_new_tokens": 1})
    t0 = time.perf_counter()
    out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": steps, "ignore_eos": True})
    seconds = time.perf_counter() - t0
    return len(out["output_ids"]) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 prompts, 512-token context")
    ap.add_argument("--budget-gib", type=float, default=1.0, help="KV budget for capacity")
    ap.add_argument("--context", type=int, default=2048, help="long-prompt tokens for decode")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3, help="decode measurements per dtype")
    ap.add_argument(
        "--quantization",
        default="unquant",
        help="weights for every engine (unquant: the dequantized bf16 baseline; gguf: Q4_1 kept)",
    )
    args = ap.parse_args()
    prompts = PROMPTS[:4] if args.quick else PROMPTS
    context = 512 if args.quick else args.context
    steps = 16 if args.quick else args.decode_tokens
    budget = args.budget_gib * (1 << 30)
    engines: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        for kv in DTYPES:  # all three at once: decode is measured in alternation, rounds apart
            engines[kv] = stack.enter_context(
                radixgen.Engine(
                    kv_cache_dtype=kv,
                    grammar_backend="none",
                    max_total_tokens=context + 4096,
                    num_threads=args.num_threads,
                    quantization=args.quantization,
                    log_level="warning",
                )
            )
        tok = engines["bf16"].tokenizer
        chat = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
        outs = {kv: greedy(eng, chat) for kv, eng in engines.items()}
        per_token = {
            kv: int(eng.get_server_info()["internal_states"][0]["kv_bytes_per_token"])
            for kv, eng in engines.items()
        }
        prompt = long_prompt(tok, context)
        rates: dict[str, list[float]] = {kv: [] for kv in DTYPES}
        for _ in range(args.rounds):
            for kv, eng in engines.items():
                rates[kv].append(decode_rate(eng, prompt, steps))
    tokens = {kv: int(budget // per_token[kv]) for kv in DTYPES}
    decode = {kv: statistics.median(r) for kv, r in rates.items()}
    for kv in DTYPES:
        same, lp_diff = agreement(outs["bf16"], outs[kv])
        emit(
            {
                "kv_cache_dtype": kv,
                "agree_first_16": f"{same}/{len(prompts)}",
                "mean_abs_logprob_diff": round(lp_diff, 5),
                "kv_bytes_per_token": per_token[kv],
                "budget_gib": args.budget_gib,
                "max_total_tokens_at_budget": tokens[kv],
                "tokens_vs_bf16": round(tokens[kv] / tokens["bf16"], 3),
                "context_tokens": context,
                "decode_tok_s": round(decode[kv], 1),
                "decode_vs_bf16": round(decode[kv] / decode["bf16"], 3),
                "decode_rounds": [round(r, 1) for r in rates[kv]],
            }
        )


if __name__ == "__main__":
    main()
