"""`radixgen batch`: a Batch API input file offline, in-process; answers appended as they finish,
bad lines to the error file, and `--resume` running only the custom_ids not answered yet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each run starts an engine

FLAGS = ["--num-threads", "1", "--log-level", "warning"]


def line(custom_id: str, i: int) -> dict:
    if i % 2:
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                "body": {"model": "m", "prompt": f"{i} plus {i} is", "max_tokens": 6,
                         "temperature": 0}}  # fmt: skip
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": f"Name fruit {i}."}],
                     "max_tokens": 8, "temperature": 0}}  # fmt: skip


def run_batch(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "radixgen.cli", "batch", *args, *FLAGS]
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=300)


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_batch_then_resume_answers_every_custom_id_once(tmp_path):
    lines = [line(f"r{i}", i) for i in range(10)]
    bad = {"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "m", "messages": [{"role": "user", "content": "x"}],
                    "temperature": -1}}  # fmt: skip
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in [*lines, bad]) + "not json\n")
    out, errors = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    first = run_batch("-i", str(src), "-o", str(out))
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    assert b"10 answered, 2 failed" in first.stderr
    answered = read(out)
    assert sorted(r["custom_id"] for r in answered) == sorted(f"r{i}" for i in range(10))
    for r in answered:
        body = r["response"]["body"]
        assert r["response"]["status_code"] == 200 and body["usage"]["completion_tokens"] > 0
        assert body["object"] in ("chat.completion", "text_completion")
    failed = {r["custom_id"]: r for r in read(errors)}
    assert failed["bad"]["response"]["status_code"] == 400
    assert "not valid JSON" in failed[None]["error"]["message"]

    # a crash after 4 answers, the 5th torn mid-write: --resume runs the other 6, once each
    kept = out.read_text().splitlines(keepends=True)
    out.write_text("".join(kept[:4]) + kept[4][:20])
    again = run_batch("-i", str(src), "-o", str(out), "--resume")
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    assert b"6 answered, 0 failed" in again.stderr
    resumed = read(out)
    assert sorted(r["custom_id"] for r in resumed) == sorted(f"r{i}" for i in range(10))
    assert resumed[:4] == answered[:4]  # the answers already written stay as they were
    assert len(read(errors)) == 2  # the bad lines are not written twice


def test_stdin_to_stdout_and_duplicate_ids_refused(tmp_path):
    lines = "".join(json.dumps(line(f"s{i}", i)) + "\n" for i in range(3))
    done = run_batch("-i", "-", "-o", "-", stdin=lines.encode())
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    records = [json.loads(x) for x in done.stdout.decode().splitlines()]
    assert sorted(r["custom_id"] for r in records) == ["s0", "s1", "s2"]
    dup = tmp_path / "dup.jsonl"
    dup.write_text(json.dumps(line("same", 0)) + "\n" + json.dumps(line("same", 1)) + "\n")
    refused = run_batch("-i", str(dup), "-o", str(tmp_path / "o.jsonl"))
    assert refused.returncode == 2 and b"custom_id 'same' is also on line 1" in refused.stderr
