"""radixgen.lang program-level optimisations, each on vs off, with the radix cache on vs off.

Workloads on the default model, all through one RuntimeEndpoint per server:
  (a) few_shot_qa: a 5-shot QA program over 64 questions (run_batch; traced prefix prefilled);
  (b) tree_of_thought: 3 levels x 3 branches (39 gens, fork prefix prefill), one tree;
  (c) select4: a few-shot classifier choosing among 4 labels for 64 items (batched select),
      and the same for 16 items one at a time (the latency a single user sees);
  (d) dtype_int: 32 gens with dtype=int, grammar-constrained vs free text + parse + retries.
"optimizations on/off" flips every global_config switch together; each workload also runs with
only its own switch off (radix cache on) so each optimisation is measured alone. Two servers are
started one after the other: radix cache on, then `--disable-radix-cache`. One JSON line per
run, then the ratios; `--results` writes the "Programs (radixgen.lang)" section of RESULTS.md.

    python benchmark/bench_programs.py [--items 64] [--results benchmark/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from server_launch import launch_server

import radixgen as rg
from radixgen.lang.backend.runtime_endpoint import RuntimeEndpoint

TOPICS = [" sports", " politics", " science", " business"]
QA_SHOTS = [
    ("Which gas do plants take in from the air to make their food?", "Carbon dioxide"),
    ("What is the largest ocean on Earth?", "The Pacific Ocean"),
    ("Who wrote the play Romeo and Juliet?", "William Shakespeare"),
    ("What is the boiling point of water at sea level in Celsius?", "100 degrees"),
    ("Which organ pumps blood through the human body?", "The heart"),
]
QA_INSTRUCTIONS = (
    "You are a careful quiz assistant. Read each question, think about the facts you know, and "
    "answer with a short phrase. Do not explain the answer and do not repeat the question.\n\n"
)
CLS_SHOTS = [
    ("The striker scored twice in the final minutes to win the cup.", " sports"),
    ("Parliament passed the new budget after a long night of debate.", " politics"),
    ("Researchers measured how fast the glacier is melting each year.", " science"),
    ("The company reported record profits and raised its dividend.", " business"),
    ("The coach praised the defence after the narrow away victory.", " sports"),
]
SUBJECTS = ["the team", "the minister", "the lab", "the bank", "the league", "the senate",
            "the telescope", "the startup"]  # fmt: skip
EVENTS = ["announced a surprising result", "faced strong criticism", "won wide praise",
          "changed its plans", "set a new record", "opened an inquiry", "released new data",
          "delayed the launch"]  # fmt: skip
FLAGS = {
    "few_shot_qa": ["enable_precache_with_tracing"],
    "tree_of_thought": ["enable_fork_precache", "enable_precache_with_tracing"],
    "select4": ["enable_batched_select", "enable_precache_with_tracing"],
    "select4_one_at_a_time": ["enable_batched_select"],
    "dtype_int": ["enable_constrained_decoding"],
}


class CountingEndpoint(RuntimeEndpoint):
    """Counts the /generate requests a workload sends."""

    requests_sent = 0

    def _post(self, payload: dict[str, Any]) -> Any:
        self.requests_sent += 1
        return super()._post(payload)


@rg.function
def few_shot_qa(s, question):
    s += QA_INSTRUCTIONS
    for q, a in QA_SHOTS:
        s += f"Question: {q}\nAnswer: {a}\n\n"
    s += "Question: " + question + "\nAnswer:"
    s += rg.gen("answer", max_tokens=8, stop="\n", temperature=0)


@rg.function
def classify(s, text):
    s += "Classify each news sentence by topic: sports, politics, science or business.\n\n"
    for t, label in CLS_SHOTS:
        s += f"Sentence: {t}\nTopic:{label}\n\n"
    s += "Sentence: " + text + "\nTopic:"
    s += rg.select("topic", choices=TOPICS)


def explore(s, depth: int, width: int) -> None:
    """Breadth first: every node of a level forks before any join, so a level's gens run
    together; joins go deepest first so each parent gathers its children's lists."""
    frontier, groups = [s], []
    for level in range(1, depth + 1):
        next_frontier = []
        for node in frontier:
            forks = node.fork(width)
            forks += lambda i, level=level: (
                f"Step {level}, option {i + 1}:"
                + rg.gen(f"idea_{level}", max_tokens=12, stop="\n", temperature=0)
                + "\n"
            )
            groups.append(forks)
            next_frontier.extend(forks)
        frontier = next_frontier
    for forks in reversed(groups):
        forks.join()


@rg.function
def tree_of_thought(s, problem):
    s += rg.system("You solve problems by exploring several options step by step.")
    s += rg.user("Problem: " + problem + "\nExplore options at each step, one per line.")
    s += rg.assistant_begin()
    explore(s, depth=3, width=3)
    s += rg.assistant_end()


@rg.function
def count_int(s, animal):
    s += "Q: How many legs does a " + animal + " have?\nA:"
    s += rg.gen("legs", dtype=int, max_tokens=4)


Workload = tuple[rg.SglFunction, list[dict[str, Any]], int | str]


def workloads(items: int) -> dict[str, Workload]:
    """name -> (program, argument sets, run_batch threads)."""
    questions = [{"question": f"What is {a} plus {b}?"} for a in range(1, 9) for b in range(1, 9)]
    sentences = [{"text": f"Yesterday {s} {e}."} for s in SUBJECTS for e in EVENTS]
    animals = ["dog", "cat", "spider", "bird", "ant", "horse", "snake", "fish"] * 4
    return {
        "few_shot_qa": (few_shot_qa, questions[:items], "auto"),
        "tree_of_thought": (tree_of_thought, [{"problem": "How can a school cut its energy bill?"}], 1),
        "select4": (classify, sentences[:items], "auto"),
        "select4_one_at_a_time": (classify, sentences[: max(items // 4, 1)], 1),
        "dtype_int": (count_int, [{"animal": a} for a in animals[: max(items // 2, 1)]], "auto"),
    }  # fmt: skip


def run_once(
    backend: CountingEndpoint,
    program: rg.SglFunction,
    batch: list[dict[str, Any]],
    threads: int | str = "auto",
) -> dict[str, Any]:
    try:
        backend.flush_cache()
    except rg.BackendError:
        pass  # a server without a radix cache has nothing to flush
    backend.requests_sent = 0
    start = time.perf_counter()
    states = program.run_batch(batch, backend=backend, temperature=0, num_threads=threads)
    seconds = time.perf_counter() - start
    failed = [s for s in states if s.error() is not None]
    return {"seconds": round(seconds, 3), "items": len(batch), "failed": len(failed),
            "requests": backend.requests_sent,
            "items_per_s": round(len(batch) / seconds, 2)}  # fmt: skip


def measure(
    url: str, radix: bool, items: int, repeats: int, emit: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """Every workload under every setting; the fastest of `repeats` runs (the machine is shared,
    so the minimum is the least disturbed figure)."""
    backend = CountingEndpoint(url)
    rows = []
    for program, batch, _ in workloads(items).values():  # warm up every code path once
        run_once(backend, program, batch[:1])
    for name, (program, batch, threads) in workloads(items).items():
        settings: list[tuple[str, dict[str, bool]]] = [("on", {}), ("off", {})]
        if radix:
            settings += [(f"only {flag} off", {flag: False}) for flag in FLAGS[name]]
        for label, overrides in settings:
            with rg.global_config.optimizations(label != "off"):
                for flag, value in overrides.items():
                    setattr(rg.global_config, flag, value)
                runs = [run_once(backend, program, batch, threads) for _ in range(repeats)]
                result = min(runs, key=lambda r: r["seconds"])
            row = {"bench": "programs", "workload": name, "radix_cache": radix,
                   "optimizations": label, **result}  # fmt: skip
            emit(row)
            rows.append(row)
    return rows


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def seconds(workload: str, radix: bool, opt: str) -> float | None:
        for r in rows:
            if (r["workload"], r["radix_cache"], r["optimizations"]) == (workload, radix, opt):
                return r["seconds"]
        return None

    out = []
    for workload in FLAGS:
        on_on, off_off = seconds(workload, True, "on"), seconds(workload, False, "off")
        on_off, off_on = seconds(workload, True, "off"), seconds(workload, False, "on")
        if on_on is None:
            continue
        row: dict[str, Any] = {"bench": "programs", "workload": workload}
        if off_off:
            row["speedup_all_on_vs_all_off"] = round(off_off / on_on, 2)
        if on_off:
            row["speedup_optimizations_radix_on"] = round(on_off / on_on, 2)
        if off_on:
            row["speedup_radix_cache_optimizations_on"] = round(off_on / on_on, 2)
        for flag in FLAGS[workload]:
            alone = seconds(workload, True, f"only {flag} off")
            if alone:
                row[f"speedup_{flag}"] = round(alone / on_on, 2)
        out.append(row)
    return out


def write_results(path: str, rows: list[dict[str, Any]], summary: list[dict[str, Any]],
                  command: str, loads: list[str]) -> None:  # fmt: skip
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from benchmark_results import replace_section  # type: ignore[import-not-found]

    lines = [f"Command: `{command}`", "", f"Load average (1/5/15 min) at start and end: "
             f"{loads[0]}; {loads[-1]} (a shared 2-core machine: compare ratios, not seconds).",
             "", "| workload | radix cache | optimisations | seconds | requests | items/s | failed |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['workload']} | {'on' if r['radix_cache'] else 'off'} | {r['optimizations']} "
            f"| {r['seconds']} | {r['requests']} | {r['items_per_s']} | {r['failed']} |"
        )
    lines += ["", "Speedups (seconds of the slower setting / seconds with everything on):", ""]
    for s in summary:
        figures = ", ".join(f"{k.removeprefix('speedup_')} {v}x" for k, v in s.items()
                            if k.startswith("speedup_"))  # fmt: skip
        lines.append(f"- {s['workload']}: {figures}")
    lines += ["", *NOTES]
    replace_section(path, "Programs (radixgen.lang)", "\n".join(lines))


NOTES = [
    "How to read it: `optimisations off` flips every `global_config` switch; `only X off` keeps",
    "the others on. The radix cache is what makes shared prefixes cheap; the program-level",
    "switches decide which requests a program sends. RadixGen's scheduler already defers a",
    "request that shares 32+ uncached tokens with one being prefilled, so requests arriving",
    "together share their prefix without help and the client-side prefills (run_batch's traced",
    "prefix, fork's prefix) change little; they are sent only for text the server has not seen.",
    "Batched select (one scoring request for all choices, after a prefill of a new prefix) pays",
    "off most for a program running alone (`select4_one_at_a_time`); at 64-way concurrency it",
    "measured 0.91x to 1.15x across our runs: 64 programs arriving together already share",
    "their prefix through the scheduler's in-batch deferral, so one request per choice costs",
    "little more than one batched scoring request. Without",
    "a radix cache that prefix prefill is wasted work (select4, radix cache off). With",
    "constrained decoding off, `dtype=int` falls back to free text that must parse, with up to 3",
    "tries; the model answers in words, so every program fails (`failed`) after 3 requests.",
]


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=64, help="items of workloads (a) and (c)")
    parser.add_argument("--server-args", default="--num-threads 2", help="extra server flags")
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting (min kept)")
    parser.add_argument("--results", help="write the section into this RESULTS.md")
    args = parser.parse_args(argv)

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    loads = [load_average()]
    emit({"bench": "programs", "load_average": loads[0]})
    rows: list[dict[str, Any]] = []
    for radix in (True, False):
        extra = args.server_args.split() + ([] if radix else ["--disable-radix-cache"])
        proc, url = launch_server(extra)
        try:
            rows += measure(url, radix, args.items, args.repeats, emit)
        finally:
            proc.terminate()
            proc.wait(60)
    loads.append(load_average())
    emit({"bench": "programs", "load_average": loads[-1]})
    summary = ratios(rows)
    for s in summary:
        emit(s)
    if args.results:
        command = "python benchmark/bench_programs.py " + " ".join(argv or sys.argv[1:])
        write_results(args.results, rows, summary, command.strip(), loads)


if __name__ == "__main__":
    main()
