"""The per-step cost of the output messages: one decode step of N streaming requests, from the
scheduler's outbox to the TokenizerManager's message, without a model.

Per step: build the scheduler's `BatchTokenIDOut` (`collect_outputs`), pickle and unpickle it
(the ZMQ hop to the detokenizer), decode it (`DetokenizerManager.handle`, with a stub tokenizer
so only our Python is timed), pickle and unpickle the `BatchStrOut` (the hop to the API
process). Prints one JSON line: microseconds per step for each part (the best of `--repeats`
runs of `--steps` steps each) and the token message's size. It uses only those two public entry
points, so the same file measures an older checkout: run it with each checkout's interpreter
and compare `wire_us` (build + both round trips).

    python benchmark/bench_wire.py [--requests 64] [--steps 200] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import pickle
import time

from radixgen.io_struct import TokenizedGenerateReq
from radixgen.runtime.detokenizer.detokenizer_manager import DetokenizerManager
from radixgen.runtime.scheduler.output_processor import collect_outputs
from radixgen.runtime.scheduler.req import Req
from radixgen.sampling_params import SamplingParams

PARTS = ("build_us", "token_msg_round_trip_us", "detokenize_us", "text_msg_round_trip_us")


class StubTokenizer:
    """One character per token: the detokenizer's own work, not a tokenizer's."""

    def decode_batch(self, batch: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return ["x" * len(ids) for ids in batch]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "x" * len(ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    proto = pickle.HIGHEST_PROTOCOL
    reqs = [
        Req(TokenizedGenerateReq(f"req-{i:032x}", [1, 2, 3], SamplingParams(), stream=True), 0)
        for i in range(args.requests)
    ]
    detok = DetokenizerManager(StubTokenizer())  # type: ignore[arg-type]
    size = 0

    def reset() -> None:
        for r in reqs:
            r.output_ids.clear()
            r.sent_output_len = 0
        detok.states.clear()

    def step() -> tuple[float, float, float, float]:
        nonlocal size
        for r in reqs:
            r.output_ids.append(7)
            r.steps_since_stream = 1
        t0 = time.perf_counter()
        (msg,) = collect_outputs(reqs, 1).messages
        t1 = time.perf_counter()
        data = pickle.dumps(msg, proto)
        msg = pickle.loads(data)
        t2 = time.perf_counter()
        out = detok.handle(msg)
        t3 = time.perf_counter()
        pickle.loads(pickle.dumps(out, proto))
        t4 = time.perf_counter()
        size = len(data)
        return t1 - t0, t2 - t1, t3 - t2, t4 - t3

    for _ in range(args.steps):  # warm-up
        step()
    best = [float("inf")] * len(PARTS)
    for _ in range(args.repeats):
        reset()
        totals = [0.0] * len(PARTS)
        for _ in range(args.steps):
            for j, seconds in enumerate(step()):
                totals[j] += seconds
        best = [min(b, 1e6 * t / args.steps) for b, t in zip(best, totals, strict=True)]
    result = {name: round(v, 1) for name, v in zip(PARTS, best, strict=True)}
    result["wire_us"] = round(best[0] + best[1] + best[3], 1)
    result["token_msg_bytes"] = size
    result["requests"] = args.requests
    print(json.dumps(result))


if __name__ == "__main__":
    main()
