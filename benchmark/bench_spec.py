"""N-gram speculative decoding on vs off, in one run, on the default model.

Workloads (greedy; each request's prompt is its own, so the prefix cache plays no part):
  (a) json: JSON extraction (a JSON-schema constraint) of fields that appear verbatim in
      ~1-2k-token documents (the examples/json_extract.py kind of job);
  (b) rag: answers that quote a passage of a ~1k-token context;
  (c) random: stories from short prompts (no repetition in the prompt to draft from).
Each at concurrency 1 (requests one after another), 8 and 32 (that many at once). Both engines
stay up and run each (workload, concurrency) back to back, the order alternating. Reported per
row: decode tok/s (output tokens after the first, per second after the first token, summed over
requests running together: what speculation speeds up; at concurrency 8 and 32 the span from the
earliest first token holds the other requests' chunked prefills, which speculation does not
touch), all-decoding tok/s (at concurrency 8 and 32: output tokens per second from the last
request's first token on, while every request decodes), end-to-end output tok/s, mean TTFT,
mean accepted tokens per verify step (accepted drafts + the bonus token), the forward steps each
mode ran (independent of machine noise) and whether the outputs were identical (greedy: they
must be).

    python benchmark/bench_spec.py [--quick] [--repeats N] [--results benchmark/RESULTS.md]
        [--device cuda] [--model-path FOLDER]

On the GPU machine (scripts/gpu_check.sh) the model is the default model's shape with random
weights: outputs there quote nothing, so drafts are rarely accepted, and the row measures what
verifying the drafts costs a step.

Prints one JSON line per result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import zlib
from typing import Any

import radixgen

FIRST = ["Alice", "Omar", "Mei", "Lars", "Priya", "Diego", "Hana", "Kwame", "Sofia", "Ivan"]
LAST = ["Brown", "Haddad", "Chen", "Berg", "Raman", "Lopez", "Sato", "Mensah", "Rossi", "Petrov"]
CITY = ["Leeds", "Lyon", "Osaka", "Bergen", "Pune", "Quito", "Kyoto", "Accra", "Turin", "Omsk"]
NOUN = ["report", "meeting", "budget", "order", "shipment", "review", "contract", "schedule",
        "invoice", "survey", "warehouse", "supplier", "committee", "project", "audit", "team"]  # fmt: skip
VERB = ["approved", "delayed", "discussed", "revised", "signed", "checked", "moved", "planned",
        "cancelled", "finished", "noted", "questioned", "shared", "updated"]  # fmt: skip
ADJ = ["quarterly", "annual", "urgent", "minor", "regional", "external", "internal", "final",
       "draft", "weekly", "northern", "technical", "detailed", "brief"]  # fmt: skip
TOPICS = ["the sea", "a robot", "autumn", "a lighthouse", "coffee", "a dragon", "the moon",
          "a library", "trains", "a garden", "winter", "a violin", "the desert", "a market"]  # fmt: skip

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "full_name": {"type": "string"},
            "email": {"type": "string"},
            "company": {"type": "string"},
            "street_address": {"type": "string"},
            "city": {"type": "string"},
            "phone": {"type": "string"},
            "job_title": {"type": "string"},
        },
        "required": ["full_name", "email", "company", "street_address", "city", "phone",
                     "job_title"],
    }
)  # fmt: skip


def filler(rng: random.Random, sentences: int) -> str:
    """Business prose that never repeats a sentence (words recur, their order does not)."""
    return " ".join(
        f"The {rng.choice(ADJ)} {rng.choice(NOUN)} for {rng.choice(NOUN)} {rng.randint(10, 999)} "
        f"was {rng.choice(VERB)} by the {rng.choice(ADJ)} {rng.choice(NOUN)} on day "
        f"{rng.randint(1, 28)}."
        for _ in range(sentences)
    )


def json_prompt(tok: Any, rng: random.Random) -> tuple[str, dict[str, Any]]:
    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}-{rng.choice(LAST)}"
    fields = (
        f"The contact for this account is {name}, reachable at "
        f"{name.split()[0].lower()}.{rng.randint(100, 999)}@{rng.choice(LAST).lower()}-"
        f"logistics.example.com or by phone on +44 {rng.randint(1000, 9999)} "
        f"{rng.randint(100000, 999999)}. {name.split()[0]} works as Senior {rng.choice(ADJ).title()} "
        f"{rng.choice(NOUN).title()} Coordinator at {rng.choice(LAST)} & {rng.choice(LAST)} "
        f"Freight Holdings Limited, whose office is at {rng.randint(1, 400)} "
        f"{rng.choice(LAST)} {rng.choice(['Street', 'Road', 'Avenue', 'Lane'])}, "
        f"{rng.choice(CITY)}."
    )
    n = rng.randint(40, 80)  # ~1-2k tokens of document in all
    at = rng.randint(5, n - 5)
    doc = f"{filler(rng, at)} {fields} {filler(rng, n - at)}"
    text = tok.apply_chat_template(
        [{"role": "user", "content": f"Extract the contact's details as JSON.\n\n{doc}"}]
    )
    return text, {"json_schema": SCHEMA, "max_new_tokens": 160}


def rag_prompt(tok: Any, rng: random.Random) -> tuple[str, dict[str, Any]]:
    passages = [filler(rng, 8) for _ in range(6)]
    k = rng.randrange(len(passages))
    context = "\n\n".join(f"[{i + 1}] {p}" for i, p in enumerate(passages))
    question = (
        f"{context}\n\nQuote passage [{k + 1}] word for word, then say in one sentence what it "
        "is about."
    )
    text = tok.apply_chat_template([{"role": "user", "content": question}])
    return text, {"max_new_tokens": 160}


def random_prompt(tok: Any, rng: random.Random) -> tuple[str, dict[str, Any]]:
    topic = rng.choice(TOPICS)
    text = tok.apply_chat_template(
        [
            {
                "role": "user",
                "content": f"Write a short story about {topic} (#{rng.randint(0, 999)}).",
            }
        ]
    )
    return text, {"max_new_tokens": 128, "ignore_eos": True}


WORKLOADS = {"json": json_prompt, "rag": rag_prompt, "random": random_prompt}


async def one(engine: radixgen.Engine, prompt: str, params: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    first = None
    last: dict[str, Any] = {}
    stamps: list[tuple[float, int]] = []  # (clock, output tokens so far) per streamed chunk
    async for chunk in await engine.async_generate(prompt, params, stream=True):
        now = time.perf_counter()
        if first is None and chunk["output_ids"]:
            first = now - t0
        stamps.append((now, len(chunk["output_ids"])))
        last = chunk
    end = time.perf_counter() - t0
    return {"ids": last["output_ids"], "ttft": first or end, "e2e": end, "t0": t0, "stamps": stamps}


def decode_phase_tok_s(outs: list[dict[str, Any]]) -> float:
    """Output tokens per second while every request of the group is decoding: from the last
    request's first token to the last finish (no prefill of another request in the span)."""
    start = max(o["t0"] + o["ttft"] for o in outs)
    end = max(o["t0"] + o["e2e"] for o in outs)
    made = 0
    for o in outs:
        before = max((n for t, n in o["stamps"] if t <= start), default=0)
        made += len(o["ids"]) - before
    return made / (end - start) if end > start else 0.0


async def run_group(engine: radixgen.Engine, reqs: list[tuple[str, dict]], conc: int) -> list:
    """`conc` 1: one after another; else all at once (len(reqs) == conc)."""
    if conc == 1:
        return [await one(engine, p, sp) for p, sp in reqs]
    return list(await asyncio.gather(*(one(engine, p, sp) for p, sp in reqs)))


def measure(engine: radixgen.Engine, reqs: list[tuple[str, dict]], conc: int) -> dict[str, Any]:
    engine.flush_cache()
    before = engine.get_server_info()["internal_states"][0]
    t = time.perf_counter()
    outs = asyncio.run(run_group(engine, reqs, conc))
    wall = time.perf_counter() - t
    after = engine.get_server_info()["internal_states"][0]
    tokens = sum(len(o["ids"]) for o in outs)
    decode_tokens = sum(max(0, len(o["ids"]) - 1) for o in outs)
    # decode time: from the first token on (one after another: summed; at once: the span
    # from the earliest first token to the last finish)
    if conc == 1:
        decode_s = sum(o["e2e"] - o["ttft"] for o in outs)
    else:
        decode_s = max(o["t0"] + o["e2e"] for o in outs) - min(o["t0"] + o["ttft"] for o in outs)
    verified = after["spec_verified_requests"] - before["spec_verified_requests"]
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    return {
        "ids": [o["ids"] for o in outs],
        "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
        # one after another the same as decode_tok_s; at once, without other requests' prefill
        "phase_tok_s": (
            decode_tokens / decode_s if conc == 1 and decode_s > 0 else decode_phase_tok_s(outs)
        ),
        "e2e_tok_s": tokens / wall,
        "ttft_s": sum(o["ttft"] for o in outs) / len(outs),
        "accept_length": (accepted + verified) / verified if verified else None,
        "steps": after["forward_steps"] - before["forward_steps"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests, concurrency 1 and 8")
    ap.add_argument("--results", help="append a markdown table of the figures to this file")
    ap.add_argument("--workloads", default="json,rag,random")
    ap.add_argument("--concurrency", help="comma-separated levels (default 1,8,32; quick: 1,8)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per mode and row (order alternating; best kept)",
    )
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto (the engine's flag)")
    ap.add_argument("--model-path", help="a model folder (default: the bundled default model)")
    args = ap.parse_args()
    concs = [1, 8] if args.quick else [1, 8, 32]
    if args.concurrency:
        concs = [int(c) for c in args.concurrency.split(",")]
    single_n = 2 if args.quick else 4
    common: dict[str, Any] = {"log_level": "warning", "max_total_tokens": 80_000}
    common["device"] = args.device
    if args.model_path:
        common["model_path"] = args.model_path
    with (
        radixgen.Engine(**common) as base,
        radixgen.Engine(speculative_algorithm="NGRAM", **common) as spec,
    ):
        tok = base.tokenizer
        for eng in (base, spec):  # warm-up: kernels, grammar compile
            p, sp = json_prompt(tok, random.Random(-1))
            eng.generate(p, {**sp, "temperature": 0, "max_new_tokens": 8})
        rows = []
        order = 0
        for name in args.workloads.split(","):
            for conc in concs:
                rng = random.Random(zlib.crc32(f"{name}-{conc}".encode()))
                n = single_n if conc == 1 else conc
                reqs = [WORKLOADS[name](tok, rng) for _ in range(n)]
                reqs = [(p, {**sp, "temperature": 0}) for p, sp in reqs]
                res: dict[str, dict[str, Any]] = {}
                for _ in range(args.repeats):
                    pair = [("off", base), ("on", spec)]
                    if order % 2:
                        pair.reverse()
                    order += 1
                    for mode, eng in pair:
                        got = measure(eng, reqs, conc)
                        if mode not in res or got["decode_tok_s"] > res[mode]["decode_tok_s"]:
                            res[mode] = got
                off, on = res["off"], res["on"]
                row = {
                    "workload": name,
                    "concurrency": conc,
                    "requests": n,
                    "decode_tok_s_off": round(off["decode_tok_s"], 1),
                    "decode_tok_s_on": round(on["decode_tok_s"], 1),
                    "decode_speedup": round(on["decode_tok_s"] / off["decode_tok_s"], 3),
                    "phase_tok_s_off": round(off["phase_tok_s"], 1),
                    "phase_tok_s_on": round(on["phase_tok_s"], 1),
                    "phase_speedup": round(on["phase_tok_s"] / off["phase_tok_s"], 3),
                    "e2e_tok_s_off": round(off["e2e_tok_s"], 1),
                    "e2e_tok_s_on": round(on["e2e_tok_s"], 1),
                    "e2e_speedup": round(on["e2e_tok_s"] / off["e2e_tok_s"], 3),
                    "ttft_s_off": round(off["ttft_s"], 3),
                    "ttft_s_on": round(on["ttft_s"], 3),
                    "accept_length": on["accept_length"] and round(on["accept_length"], 2),
                    "forward_steps_off": off["steps"],
                    "forward_steps_on": on["steps"],
                    "identical": off["ids"] == on["ids"],
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
        info = spec.get_server_info()["internal_states"][0]
        print(json.dumps({k: v for k, v in info.items() if k.startswith("spec_")}), flush=True)
    if args.results:
        write_table(args.results, rows, " ".join(sys.argv))


def write_table(path: str, rows: list[dict[str, Any]], command: str) -> None:
    lines = [
        "",
        f"`python {command}`",
        "",
        "| workload | conc | decode tok/s off / on | speedup | all-decoding tok/s off / on "
        "| speedup | e2e tok/s off / on | speedup | TTFT s off / on | accepted/step "
        "| forward steps off / on | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {r['decode_tok_s_off']} / "
            f"{r['decode_tok_s_on']} | {r['decode_speedup']}x | {r['phase_tok_s_off']} / "
            f"{r['phase_tok_s_on']} | {r['phase_speedup']}x | {r['e2e_tok_s_off']} / "
            f"{r['e2e_tok_s_on']} | {r['e2e_speedup']}x | {r['ttft_s_off']} / {r['ttft_s_on']} "
            f"| {r['accept_length']} | {r['forward_steps_off']} / {r['forward_steps_on']} "
            f"| {r['identical']} |"
        )
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
