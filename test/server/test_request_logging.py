"""The server's log as an operator reads it: a line per refused request with its reason, and
`--log-requests` lines for accepted ones; every answer carries its `x-request-id`."""

from __future__ import annotations

import json
import time

import pytest


def log_line(server, needle: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        with open(server.log_path, errors="replace") as f:  # whole: .log() keeps only its tail
            lines = f.read().splitlines()
        for line in lines:
            if needle in line:
                return line
        if time.monotonic() > deadline:
            pytest.fail(f"no log line with {needle!r}")
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                  "temperature": -1}, 400),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                  "response_format": {"type": "json_schema", "json_schema": {
                                      "name": "s", "schema": {"type": "object", "required": 3}}}},
         400),
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -5}}, 400),
        ("/no/such/route", {}, 404),
    ],
)  # fmt: skip
def test_a_refused_request_logs_its_status_route_id_and_reason(server, http, path, body, status):
    rid = f"refusal-{path.strip('/').replace('/', '-')}-{time.monotonic_ns()}"
    r = http.post(path, json=body, headers={"x-request-id": rid})
    assert r.status_code == status
    assert r.headers["x-request-id"] == rid
    message = r.json()["error"]["message"]
    line = log_line(server, f"request_id={rid}")
    assert "WARNING" in line
    assert f"refused {status} POST {path} request_id={rid}: {message}" in line


def test_every_answer_carries_a_request_id(http):
    r = http.get("/v1/models")
    assert r.status_code == 200 and len(r.headers["x-request-id"]) == 32


def test_log_requests_writes_one_line_per_finished_request(server, http):
    rid = f"logged-{time.monotonic_ns()}"
    r = http.post(
        "/generate",
        json={"rid": rid, "text": "The capital of France is",
              "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
    )  # fmt: skip
    assert r.status_code == 200
    line = log_line(server, f'"rid": "{rid}"')
    record = json.loads(line[line.index("{") :])
    assert record["prompt_tokens"] > 0 and record["completion_tokens"] == 4
    assert record["finish_reason"] == {"type": "length", "length": 4}
    # the default level (2): sampling parameters that differ from the defaults, input and output
    assert record["sampling_params"]["max_new_tokens"] == 4
    assert record["sampling_params"]["temperature"] == 0
    assert record["input"] == "The capital of France is"
    assert record["output"] == r.json()["text"]
