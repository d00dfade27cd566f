"""The batch runner with a fake `execute` (no server): shuffled lines are run grouped by their
prompt prefix, at most `max_in_flight` at a time, and the output file keeps input order."""

from __future__ import annotations

import asyncio
import json
import random

from radixgen.runtime.batch.runner import BatchRunner, read_jsonl
from radixgen.runtime.batch.store import BatchStore


def test_runner_runs_lines_grouped_by_prefix_and_bounded(tmp_path):
    rng = random.Random(3)
    systems = [f"system prompt {k} " * 40 for k in range(4)]
    lines = [(k, d) for k in range(4) for d in range(5)]
    rng.shuffle(lines)
    data = b"".join(
        json.dumps({"custom_id": f"{k}-{d}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "system", "content": systems[k]},
                                          {"role": "user", "content": f"doc {d}"}]}}).encode()
        + b"\n"
        for k, d in lines
    )  # fmt: skip
    store = BatchStore(tmp_path)
    file = store.add_file("in.jsonl", "batch", data)
    batch = store.add_batch("/v1/chat/completions", file["id"], 3600, "24h", None)
    ran: list[int] = []
    live = peak = 0

    async def execute(endpoint: str, body: dict) -> tuple[int, dict]:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        ran.append(systems.index(body["messages"][0]["content"]))  # in start order
        await asyncio.sleep(0.001)
        live -= 1
        return 200, {"id": "x"}

    async def main() -> None:
        runner = BatchRunner(store, execute, max_in_flight=3, max_lines=100)
        runner.start(batch["id"])
        await asyncio.gather(*runner.tasks.values())

    asyncio.run(main())
    # every prefix's lines run together: 4 groups, in the order their first lines appear
    groups = [k for i, k in enumerate(ran) if i == 0 or ran[i - 1] != k]
    assert len(groups) == 4 and groups == list(dict.fromkeys(k for k, _ in lines))
    assert peak <= 3
    done = store.get_batch(batch["id"])
    assert done is not None and done["status"] == "completed"
    out = read_jsonl(store.file_path(done["output_file_id"]))
    assert [r["custom_id"] for r in out] == [f"{k}-{d}" for k, d in lines]  # input order
