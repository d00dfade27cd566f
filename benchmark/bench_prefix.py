"""RadixAttention benefit and overhead: the radix cache on vs `disable_radix_cache`, in one run.

Workloads on the default model:
  (a) shared few-shot prefix: 64 requests sharing a ~1,500-token prefix, distinct ~30-token
      questions, 32 output tokens each;
  (b) multi-turn chat, 16 conversations x 4 turns (each turn resends the whole conversation):
      short user turns (~20 tokens), and long ones (256-512 tokens of text, the shape of SGLang's
      benchmark/multi_turn_chat, whose answers are 4-8 tokens; ours stay 32);
  (c) tree of prompts: a 3-level branching program where children extend their parent's text;
  (d) no sharing: random distinct prompts (the cache's overhead).
For each: throughput (output tokens/s and requests/s), mean time to first token, token hit rate.
Also times `match_prefix` on a tree holding 1M tokens for a 2,000-token prompt.

    python benchmark/bench_prefix.py [--quick] [--results benchmark/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from typing import Any

import radixgen

OUT_TOKENS = 32


def emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


class Runner:
    """Runs prompts through one engine, recording per-request TTFT and the cache counters."""

    def __init__(self, engine: radixgen.Engine) -> None:
        self.engine = engine
        self.ttfts: list[float] = []
        self.requests = 0
        self.out_tokens = 0

    async def one(self, prompt: str, max_new: int = OUT_TOKENS) -> str:
        t0 = time.perf_counter()
        first = None
        last: dict[str, Any] = {}
        params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
        async for chunk in await self.engine.async_generate(prompt, params, stream=True):
            if first is None and chunk["output_ids"]:
                first = time.perf_counter() - t0
            last = chunk
        self.ttfts.append(first or 0.0)
        self.requests += 1
        self.out_tokens += last["meta_info"]["completion_tokens"]
        return last["text"]

    def state(self) -> dict[str, Any]:
        return self.engine.get_server_info()["internal_states"][0]


async def few_shot(r: Runner, n: int, prefix_words: int) -> None:
    rng = random.Random(0)
    facts = " ".join(
        f"Fact {i}: item {rng.randint(0, 999)} weighs {rng.randint(1, 99)} kg."
        for i in range(prefix_words // 8)
    )
    prefix = f"You are a precise assistant. Use these facts.\n{facts}\n"
    questions = [f"Q{i}: How much does item {rng.randint(0, 999)} weigh, and why might that matter for shipping?\nA:" for i in range(n)]  # fmt: skip
    await asyncio.gather(*(r.one(prefix + q) for q in questions))


async def multi_turn(r: Runner, conversations: int, turns: int, long_turns: bool = False) -> None:
    tok = r.engine.tokenizer

    def user_turn(c: int, t: int) -> str:
        text = f"Conversation {c}, turn {t}: tell me one more thing about topic {c}."
        if not long_turns:
            return text
        rng = random.Random(1000 * c + t)  # the same text for cache on and off
        target = rng.randint(256, 512)  # tokens, as SGLang's --min-len-q / --max-len-q
        words = [text]
        while len(tok.encode(" ".join(words))) < target:
            words += [rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(8)]
        return " ".join(words)

    async def conversation(c: int) -> None:
        messages: list[dict[str, str]] = []
        for t in range(turns):
            messages.append({"role": "user", "content": user_turn(c, t)})
            reply = await r.one(tok.apply_chat_template(messages))
            messages.append({"role": "assistant", "content": reply})

    await asyncio.gather(*(conversation(c) for c in range(conversations)))


async def tree(r: Runner, branching: int, depth: int) -> None:
    root = (
        "Let us think step by step about how to plan a city park, considering trees, paths and water. "
        * 6
    )

    async def expand(text: str, level: int) -> None:
        if level == depth:
            return
        children = [f"{text}\nBranch {level}.{k}: consider option {k}." for k in range(branching)]
        outs = await asyncio.gather(*(r.one(c) for c in children))
        await asyncio.gather(
            *(expand(c + o, level + 1) for c, o in zip(children, outs, strict=True))
        )

    await expand(root, 0)


WORDS = ["alpha", "river", "stone", "cloud", "maple", "delta", "ember", "quartz", "lunar", "fable"]


async def distinct(r: Runner, n: int) -> None:
    rng = random.Random(1)
    prompts = [
        " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(60)) for _ in range(n)
    ]
    await asyncio.gather(*(r.one(p) for p in prompts))


def run_workload(engine: radixgen.Engine, name: str, coro_fn) -> dict[str, Any]:
    engine.flush_cache()
    r = Runner(engine)
    before = r.state()
    t = time.perf_counter()
    asyncio.run(coro_fn(r))
    elapsed = time.perf_counter() - t
    after = r.state()
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    return {
        "workload": name,
        "requests": r.requests,
        "seconds": elapsed,
        "out_tok_per_s": r.out_tokens / elapsed,
        "req_per_s": r.requests / elapsed,
        "mean_ttft_s": statistics.mean(r.ttfts),
        "token_hit_rate": cached / prompt if prompt else 0.0,
    }


def match_prefix_timing() -> dict[str, Any]:
    """match_prefix on a tree of ~1M tokens (660 x 2,000-token keys sharing 500-token stems)."""
    import torch

    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.mem_cache.radix_cache import RadixCache

    pool = TokenToKVPool(1_100_000, 1, 1, 1, 1, torch.bfloat16)
    cache = RadixCache(ReqToTokenPool(1, 8), pool)
    rng = random.Random(2)
    stems = [[rng.randrange(49152) for _ in range(500)] for _ in range(10)]
    keys = []
    for i in range(660):
        key = stems[i % 10] + [rng.randrange(49152) for _ in range(1500)]
        slots = pool.alloc(len(key))
        pool.free(slots[: cache.insert(key, slots)])  # the shared stem is already held
        keys.append(key)
    held = cache.evictable_size()
    probes = [[*k[:1990], 1, 2, 3, 4, 5, 6, 7, 8, 9, 10] for k in rng.sample(keys, 50)]
    t = time.perf_counter()
    for p in probes:
        cache.match_prefix(p)
    per_call = (time.perf_counter() - t) / len(probes)
    return {
        "bench": "match_prefix",
        "tree_tokens": held,
        "prompt_tokens": 2000,
        "ms_per_match": per_call * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="on/off pairs per workload except (a), whose cache-off run alone takes minutes",
    )
    ap.add_argument("--results", default=None)
    args = ap.parse_args()
    q = args.quick
    workloads = {
        "(a) shared few-shot prefix": lambda r: few_shot(r, 16 if q else 64, 400 if q else 1100),
        "(b) multi-turn chat, short user turns": lambda r: multi_turn(r, 4 if q else 16, 4),
        "(b) multi-turn chat, 256-512-token user turns": lambda r: multi_turn(
            r, 4 if q else 16, 4, long_turns=True
        ),
        "(c) tree of prompts": lambda r: tree(r, 3, 2 if q else 3),
        "(d) no sharing": lambda r: distinct(r, 16 if q else 64),
    }
    # NOTE: both engines stay up and each workload runs cache on and off back to back (order
    # alternating), so that machine noise hits both sides of a ratio alike; the reported ratio is
    # the median over pairs, and each side's figures are its median-throughput run.
    results: dict[str, dict[str, Any]] = {}
    kwargs = {"grammar_backend": "none", "log_level": "warning"}
    with (
        radixgen.Engine(**kwargs) as on_engine,
        radixgen.Engine(disable_radix_cache=True, **kwargs) as off_engine,
    ):
        engines = {"on": on_engine, "off": off_engine}
        for name, fn in workloads.items():
            pairs = 1 if name.startswith("(a)") else max(1, args.repeats)
            runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
            for i in range(pairs):
                for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
                    rec = emit(
                        {"bench": "prefix", "cache": mode, **run_workload(engines[mode], name, fn)}
                    )
                    runs[mode].append(rec)
            ratios = [
                on["out_tok_per_s"] / off["out_tok_per_s"]
                for on, off in zip(runs["on"], runs["off"], strict=True)
            ]
            median_run = {
                m: sorted(rs, key=lambda r: r["out_tok_per_s"])[len(rs) // 2]
                for m, rs in runs.items()
            }
            results[name] = {**median_run, "ratios": ratios, "ratio": statistics.median(ratios)}
            emit({"bench": "prefix_ratio", "workload": name, "throughput_ratios": ratios,
                  "throughput_ratio": results[name]["ratio"],
                  "ttft_ratio_off_over_on": median_run["off"]["mean_ttft_s"] / median_run["on"]["mean_ttft_s"]})  # fmt: skip
    mp = emit(match_prefix_timing())
    if args.results:
        write_results(args.results, results, mp, " ".join(sys.argv))
    return 0


def write_results(path: str, results: dict, mp: dict, command: str) -> None:
    from benchmark_results import replace_section  # type: ignore[import-not-found]

    lines = [
        f"Command: `python {command}` ({time.strftime('%Y-%m-%d')})",
        "",
        "Cache on and off run back to back per workload (order alternating); tok/s and TTFT are",
        "each side's median run, the ratio is the median of the per-pair ratios.",
        "",
        "| workload | tok/s cache on | tok/s cache off | throughput ratio (pairs) | mean TTFT on / off (s) | token hit rate (on) |",
        "|---|---|---|---|---|---|",
    ]
    for name, pair in results.items():
        on, off = pair["on"], pair["off"]
        each = ", ".join(f"{r:.2f}" for r in pair["ratios"])
        lines.append(
            f"| {name} | {on['out_tok_per_s']:.1f} | {off['out_tok_per_s']:.1f} | "
            f"**{pair['ratio']:.2f}x** ({each}) | {on['mean_ttft_s']:.2f} / {off['mean_ttft_s']:.2f} | "
            f"{on['token_hit_rate']:.1%} |"
        )
    lines += [
        "",
        f"`match_prefix` for a {mp['prompt_tokens']}-token prompt on a tree holding {mp['tree_tokens']:,} tokens: "
        f"{mp['ms_per_match']:.3f} ms per call.",
    ]
    replace_section(path, "Prefix cache (bench_prefix.py)", "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
