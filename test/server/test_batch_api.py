"""OpenAI's Files and Batch APIs through the openai SDK: upload, batch, poll, download; bad lines,
duplicate ids, cancel, limits; and a server SIGKILLed mid-batch that resumes at its next start
with every custom_id answered exactly once and no finished line run again."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path

import openai
import pytest

from .server_process import ServerProcess, server_flags

FINAL = ("completed", "failed", "cancelled", "expired")


def chat_line(custom_id: str, text: str, max_tokens: int = 8, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": text}],
                     "max_tokens": max_tokens, "temperature": 0, **body}}  # fmt: skip


def jsonl(lines: list) -> bytes:
    return b"".join((x if isinstance(x, str) else json.dumps(x)).encode() + b"\n" for x in lines)


def wait_final(client: openai.OpenAI, batch_id: str, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in FINAL:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.3)


def records(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x.strip()]


def test_files_then_batch_then_output_line_for_line(oai):
    lines = [chat_line(f"q{i}", f"What is {i} plus {i}?") for i in range(5)]
    lines += [
        chat_line("bad-param", "x", temperature=-1),  # refused by the endpoint: a 400 response
        {"custom_id": "wrong-url", "method": "POST", "url": "/v1/completions", "body": {}},
        "{not json",
    ]
    file = oai.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert file.purpose == "batch" and file.bytes == len(jsonl(lines))
    assert oai.files.retrieve(file.id).filename == "in.jsonl"
    assert oai.files.content(file.id).content == jsonl(lines)
    batch = oai.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                               completion_window="24h", metadata={"job": "extract"})  # fmt: skip
    assert batch.status == "validating" and batch.metadata == {"job": "extract"}
    done = wait_final(oai, batch.id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed) == (8, 5)
    assert done.request_counts.failed == 3
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out = records(oai, done.output_file_id)
    assert [r["custom_id"] for r in out] == [f"q{i}" for i in range(5)]
    for r in out:
        assert r["error"] is None and r["response"]["status_code"] == 200
        body = r["response"]["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
        assert r["response"]["request_id"] == body["id"]
    errors = {r["custom_id"]: r for r in records(oai, done.error_file_id)}
    assert errors["bad-param"]["response"]["status_code"] == 400
    assert errors["bad-param"]["response"]["body"]["error"]["param"] == "temperature"
    assert errors["wrong-url"]["response"] is None
    assert "not this batch's endpoint" in errors["wrong-url"]["error"]["message"]
    assert "not valid JSON" in errors[None]["error"]["message"]
    listed = oai.batches.list(limit=100)
    assert batch.id in [b.id for b in listed.data]
    assert oai.files.delete(file.id).deleted
    with pytest.raises(openai.NotFoundError):
        oai.files.retrieve(file.id)


def test_duplicate_custom_ids_fail_validation(oai):
    file = oai.files.create(
        file=("dup.jsonl", jsonl([chat_line("same", "a"), chat_line("same", "b")])), purpose="batch"
    )
    batch = oai.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_final(oai, batch.id)
    assert done.status == "failed" and done.failed_at
    (error,) = done.errors.data
    assert error.code == "duplicate_custom_id" and error.line == 2
    assert done.output_file_id is None


def test_cancel_keeps_what_finished(oai):
    lines = [
        chat_line(f"c{i}", "Write a long story about a cat.", max_tokens=64) for i in range(40)
    ]
    file = oai.files.create(file=("long.jsonl", jsonl(lines)), purpose="batch")
    batch = oai.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    cancelling = oai.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_final(oai, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts.completed < 40
    assert len(records(oai, done.output_file_id)) == done.request_counts.completed
    with pytest.raises(openai.BadRequestError, match="only a validating or in-progress"):
        oai.batches.cancel(batch.id)


@pytest.mark.parametrize(
    ("create", "status", "param"),
    [
        ({"endpoint": "/v1/moderations", "completion_window": "24h"}, 400, "endpoint"),
        ({"endpoint": "/v1/chat/completions", "completion_window": "1h"}, 400, "completion_window"),
        ({"endpoint": "/v1/chat/completions", "completion_window": "24h",
          "input_file_id": "file-missing"}, 404, None),
    ],
)  # fmt: skip
def test_invalid_batches_are_refused_by_name(http, create, status, param):
    body = {"input_file_id": "file-missing", **create}
    r = http.post("/v1/batches", json=body)
    assert r.status_code == status
    assert r.json()["error"]["param"] == param


def test_upload_needs_purpose_batch(oai):
    with pytest.raises(openai.BadRequestError, match="purpose"):
        oai.files.create(file=("x.jsonl", b"{}\n"), purpose="assistants")


def _finished_in_db(data_dir: Path, batch_id: str) -> dict[str, str]:
    """custom_id -> its recorded output line, read from the database as the server left it."""
    db = sqlite3.connect(f"file:{data_dir / 'batches.sqlite3'}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT custom_id, result FROM lines WHERE batch_id = ? AND result IS NOT NULL",
        (batch_id,),
    ).fetchall()
    db.close()
    return dict(rows)


@pytest.mark.slow  # starts two servers of its own
def test_sigkill_mid_batch_resumes_each_line_exactly_once(tmp_path):
    flags = ("--data-dir", str(tmp_path), "--max-file-bytes", "200000", "--max-file-lines", "30",
             *server_flags())  # fmt: skip
    first = ServerProcess(*flags)
    try:
        first.wait_healthy()
        client = openai.OpenAI(base_url=first.url + "/v1", api_key="x", max_retries=0)
        # the limits, by name
        with pytest.raises(openai.BadRequestError, match="--max-file-lines"):
            client.files.create(file=("many.jsonl", jsonl(["{}"] * 31)), purpose="batch")
        with pytest.raises(openai.APIStatusError, match="--max-file-bytes") as big:
            client.files.create(file=("big.jsonl", b"x" * 300_000), purpose="batch")
        assert big.value.status_code == 413
        lines = [
            chat_line(f"k{i}", f"Count from {i} to {i + 20}.", max_tokens=40) for i in range(24)
        ]
        file = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 120
        while client.batches.retrieve(batch.id).request_counts.completed < 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.stop()
    before = _finished_in_db(tmp_path, batch.id)
    assert 3 <= len(before) < 24, "killed mid-batch"
    second = ServerProcess(*flags)
    try:
        second.wait_healthy()
        client = openai.OpenAI(base_url=second.url + "/v1", api_key="x", max_retries=0)
        done = wait_final(client, batch.id)
        out = records(client, done.output_file_id)
    finally:
        second.stop()
    assert done.status == "completed" and done.request_counts.completed == 24
    assert sorted(r["custom_id"] for r in out) == sorted(f"k{i}" for i in range(24))
    by_id = {r["custom_id"]: r for r in out}
    for custom_id, recorded in before.items():  # the same record: that line was not run again
        assert by_id[custom_id] == json.loads(recorded)


def test_a_responses_batch(oai):
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
              "body": {"model": "m", "input": f"Name a colour, {i}.", "max_output_tokens": 8,
                       "temperature": 0}} for i in range(2)]  # fmt: skip
    file = oai.files.create(file=("responses.jsonl", jsonl(lines)), purpose="batch")
    batch = oai.batches.create(
        input_file_id=file.id, endpoint="/v1/responses", completion_window="24h"
    )
    done = wait_final(oai, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 2
    for r in records(oai, done.output_file_id):
        body = r["response"]["body"]
        assert body["object"] == "response" and body["output"][0]["type"] == "message"
        assert body["usage"]["output_tokens"] > 0


def _cut_steps(http) -> int:
    return sum(s["cut_steps"] for s in http.get("/server_info").json()["internal_states"])


def test_interactive_requests_cut_batch_steps_and_no_output_changes(oai, http):
    """Chats sent while a batch runs stop its steps between layers (step_interrupt.py); the
    lines whose steps were cut answer what each answers alone, token for token (greedy)."""
    lines = [chat_line(f"s{i}", f"Tell a short story about the number {i}.", max_tokens=24)
             for i in range(10)]  # fmt: skip
    file = oai.files.create(file=("cut.jsonl", jsonl(lines)), purpose="batch")
    before = _cut_steps(http)
    batch = oai.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    chats = 0
    while oai.batches.retrieve(batch.id).status not in FINAL and chats < 40:
        chat = chat_line("x", f"Say hello to user {chats}.", max_tokens=2)["body"]
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
        chats += 1
    done = wait_final(oai, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 10
    assert _cut_steps(http) > before, f"{chats} chats during the batch cut no step"
    for r in records(oai, done.output_file_id):
        body = lines[int(r["custom_id"][1:])]["body"]
        alone = http.post("/v1/chat/completions", json=body).json()
        got = r["response"]["body"]["choices"][0]["message"]["content"]
        assert got == alone["choices"][0]["message"]["content"], r["custom_id"]
