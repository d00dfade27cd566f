"""Hostile-input battery (issue 12): bad, huge, slow and abusive requests against a real server.

Every case asserts the status, a fragment of the error text, and that a normal request still
succeeds afterwards. The body and prompt-size limits are the defaults; the others are set small
(flags below) so that filling them stays cheap on a 2-core machine.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from typing import Any

import httpx
import pytest
from wait_helpers import wait_until

from radixgen.server_args import LimitsConfig

from .server_process import ServerProcess, grammar_available, running_server, server_flags

pytestmark = pytest.mark.slow

DEFAULTS = LimitsConfig()
BODY_LIMIT = DEFAULTS.max_request_body_bytes  # the default limits where a case is cheap at them
PROMPT_CHARS = DEFAULTS.max_prompt_chars
# the prompts at the character limit that fit in a body at its limit (the maximal request); also
# --max-running-requests + --max-queued-requests, so that a request at the limit fits
SEQUENCES = 8
STOPS, STOP_CHARS = 8, 64
BODY_TIMEOUT_S = 2
PROMPT_OVER_LIMIT = f"the prompt has {PROMPT_CHARS + 1} characters; the limit is {PROMPT_CHARS} (--max-prompt-chars)"
LIMIT_FLAGS = [
    "--request-body-timeout", str(BODY_TIMEOUT_S),
    "--max-sequences-per-request", str(SEQUENCES),
    "--max-stop-strings", str(STOPS),
    "--max-stop-string-chars", str(STOP_CHARS),
    "--max-running-requests", "2",
    "--max-queued-requests", str(SEQUENCES - 2),
]  # fmt: skip
LONG = {"max_new_tokens": 3000, "ignore_eos": True}
needs_grammar = pytest.mark.skipif(not grammar_available(), reason="no grammar backend")


@pytest.fixture(scope="module")
def srv():
    with running_server(*LIMIT_FLAGS, *server_flags()) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=60.0) as client:
        yield client


def assert_still_serving(http: httpx.Client) -> None:
    r = http.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 1


def assert_error(r: httpx.Response, status: int, fragment: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status
    assert fragment in err["message"], err["message"]


def gen(text: str = "Hi", **sp: Any) -> dict[str, Any]:
    return {"text": text, "sampling_params": {"max_new_tokens": 1, **sp}}


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, **extra}


# (route, body: JSON-able object or raw bytes, status, error fragment)
CASES: dict[str, tuple[str, Any, int, str]] = {
    # --- the body itself
    "empty body": ("/generate", b"", 400, "body is empty"),
    "not json": ("/generate", b"{text: hi", 400, "not valid JSON"),
    "malformed utf-8": ("/generate", b'{"text": "\xff\xfe"}', 400, "not valid UTF-8"),
    "lone surrogate": ("/generate", b'{"text": "\\ud800"}', 400, "surrogate"),
    "NaN literal": (
        "/generate",
        b'{"text": "Hi", "sampling_params": {"temperature": NaN}}',
        400,
        "not valid JSON",
    ),
    "infinite number": (
        "/generate",
        b'{"text": "Hi", "sampling_params": {"top_p": 1e400}}',
        400,
        "infinity",
    ),
    "array body": ("/generate", [1, 2], 400, "must be a JSON object"),
    "unknown field": ("/generate", {**gen(), "foo": 1}, 400, "unknown field 'foo'"),
    "unsupported field": ("/generate", {**gen(), "image_data": "x.png"}, 400, "not supported"),
    # --- the prompt
    "text wrong type": ("/generate", {"text": 5}, 400, "text must be"),
    "text and input_ids": ("/generate", {"text": "a", "input_ids": [1]}, 400, "not both"),
    "no prompt": ("/generate", {"sampling_params": {}}, 400, "a prompt is required"),
    "empty prompt": ("/generate", gen(""), 400, "the prompt is empty"),
    "input_ids floats": ("/generate", {"input_ids": [1.5, 2]}, 400, "input_ids must be"),
    "input_ids huge int": ("/generate", {"input_ids": [10**18]}, 400, "outside the vocabulary"),
    "input_ids negative": ("/generate", {"input_ids": [-1]}, 400, "outside the vocabulary"),
    "prompt over max chars": (
        "/generate",
        gen("a" * (PROMPT_CHARS + 1)),
        400,
        PROMPT_OVER_LIMIT,
    ),
    "prompt over context": ("/generate", gen("hello " * 20_000), 400, "tokens; the maximum is"),
    # --- sampling fields: negative, absurd, wrong type, non-finite
    "max_new_tokens negative": ("/generate", gen(max_new_tokens=-1), 400, "max_new_tokens must"),
    "max_new_tokens huge": ("/generate", gen(max_new_tokens=10**30), 400, "exceeds the context"),
    "max_new_tokens string": ("/generate", gen(max_new_tokens="9"), 400, "must be an integer"),
    "min over max tokens": ("/generate", gen(min_new_tokens=5), 400, "must not exceed"),
    "temperature negative": ("/generate", gen(temperature=-1), 400, "temperature must be in"),
    "temperature absurd": ("/generate", gen(temperature=1e300), 400, "temperature must be in"),
    "temperature string": ("/generate", gen(temperature="hot"), 400, "must be a number"),
    "top_p zero": ("/generate", gen(top_p=0), 400, "top_p must be in"),
    "top_p absurd": ("/generate", gen(top_p=5), 400, "top_p must be in"),
    "top_k negative": ("/generate", gen(top_k=-5), 400, "top_k must be"),
    "min_p absurd": ("/generate", gen(min_p=2), 400, "min_p must be in"),
    "frequency_penalty absurd": (
        "/generate",
        gen(frequency_penalty=99),
        400,
        "frequency_penalty must be in",
    ),
    "presence_penalty negative": (
        "/generate",
        gen(presence_penalty=-99),
        400,
        "presence_penalty must be in",
    ),
    "repetition_penalty zero": (
        "/generate",
        gen(repetition_penalty=0),
        400,
        "repetition_penalty must be in",
    ),
    "n zero": ("/generate", gen(n=0), 400, "n must be in"),
    "n absurd": ("/generate", gen(n=10**6), 400, "n must be in"),
    "seed string": ("/generate", gen(seed="x"), 400, "seed must be an integer"),
    "seed bool": ("/generate", gen(seed=True), 400, "seed must be an integer"),
    "unknown sampling param": ("/generate", gen(warp=2), 400, "unknown sampling parameter"),
    "ignore_eos string": ("/generate", gen(ignore_eos="yes"), 400, "must be true or false"),
    "stop_token_ids out of vocab": (
        "/generate",
        gen(stop_token_ids=[10**9]),
        400,
        "outside the vocabulary",
    ),
    "logit_bias bad key": ("/generate", gen(logit_bias={"x": 1}), 400, "is not a token id"),
    "logit_bias absurd": ("/generate", gen(logit_bias={"1": 1e9}), 400, "[-100, 100]"),
    "stream not bool": ("/generate", {**gen(), "stream": "yes"}, 400, "stream must be a boolean"),
    "per-item list on one prompt": (
        "/generate",
        {"text": "Hi", "sampling_params": [{}]},
        400,
        "not a batch",
    ),
    # --- stop strings
    "stop wrong type": ("/generate", gen(stop=5), 400, "stop must be"),
    "stop empty string": ("/generate", gen(stop=[""]), 400, "non-empty"),
    "too many stop strings": (
        "/generate",
        gen(stop=[f"s{i}" for i in range(1000)]),
        400,
        "stop has 1000 strings; the limit is 8 (--max-stop-strings)",
    ),
    "stop string too long": (
        "/generate",
        gen(stop=["x" * 2000]),
        400,
        "2000 characters; the limit is 64 (--max-stop-string-chars)",
    ),
    # stop_regex is served (test_native_api.py); bad patterns are 400s that name them
    "stop_regex invalid": (
        "/generate",
        gen(stop_regex=["ok", "(a"]),
        400,
        "stop_regex pattern 1 ('(a') is not a valid regular expression",
    ),
    "stop_regex matching empty text": (
        "/generate",
        gen(stop_regex="x?"),
        400,
        "matches the empty text",
    ),
    "stop_regex wrong type": ("/generate", gen(stop_regex=5), 400, "stop_regex must be"),
    "too many stop_regex": (
        "/generate",
        gen(stop_regex=[f"s{i}" for i in range(1000)]),
        400,
        "stop_regex has 1000 patterns; the limit is 8 (--max-stop-strings)",
    ),
    "stop_regex too long": (
        "/generate",
        gen(stop_regex="x" * 2000),
        400,
        "2000 characters; the limit is 64 (--max-stop-string-chars)",
    ),
    "chat stop_regex invalid": (
        "/v1/chat/completions",
        chat(stop_regex="[unclosed"),
        400,
        "not a valid regular expression",
    ),
    # --- batches and n
    "2000-prompt batch": (
        "/generate",
        {"text": ["Hi"] * 2000},
        400,
        f"2000 sequences (prompts x n); the limit is {SEQUENCES}",
    ),
    "batch times n": (
        "/generate",
        {"text": ["Hi"] * 4, "sampling_params": {"n": 8}},
        400,
        "32 sequences",
    ),
    "duplicated rids": (
        "/generate",
        {"text": ["a", "b"], "rid": ["same", "same"]},
        400,
        "already in use",
    ),
    "rid list length": ("/generate", {"text": ["a", "b"], "rid": ["x"]}, 400, "1 entries"),
    # --- logprobs
    "top_logprobs_num absurd": (
        "/generate",
        {**gen(), "return_logprob": True, "top_logprobs_num": 10**6},
        400,
        "top_logprobs_num",
    ),
    "logprob_start_len absurd": (
        "/generate",
        {**gen(), "return_logprob": True, "logprob_start_len": 10**9},
        400,
        "logprob_start_len must be",
    ),
    # --- constraints
    "two constraints": (
        "/generate",
        gen(regex="a", ebnf='root ::= "a"'),
        400,
        "only one constraint",
    ),
    "json_schema wrong type": ("/generate", gen(json_schema=5), 400, "json_schema must be"),
    # --- OpenAI chat
    "chat no messages": ("/v1/chat/completions", {"max_tokens": 1}, 400, "'messages' is required"),
    "chat empty messages": ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    "chat bad role": (
        "/v1/chat/completions",
        {"messages": [{"role": "god", "content": "x"}]},
        400,
        "messages.0.role",
    ),
    "chat unknown field": (
        "/v1/chat/completions",
        chat(frobnicate=True),
        400,
        "unknown field 'frobnicate'",
    ),
    "chat n zero": ("/v1/chat/completions", chat(n=0), 400, "n"),
    "chat n over limit": (
        "/v1/chat/completions",
        chat(n=SEQUENCES + 1),
        400,
        "--max-sequences-per-request",
    ),
    "chat content over max chars": (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": "a" * (PROMPT_CHARS // 2)},
                {"role": "user", "content": "b" * (PROMPT_CHARS // 2 + 1)},
            ]
        },
        400,
        f"the messages have {PROMPT_CHARS + 1} characters; the limit is {PROMPT_CHARS}",
    ),
    "chat image part": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "only text parts",
    ),
    "chat top_logprobs absurd": (
        "/v1/chat/completions",
        chat(logprobs=True, top_logprobs=10**6),
        400,
        "top_logprobs",
    ),
    "chat max_tokens negative": ("/v1/chat/completions", chat(max_tokens=-1), 400, "max_tokens"),
    "chat temperature wrong type": (
        "/v1/chat/completions",
        chat(temperature="x"),
        400,
        "temperature",
    ),
    "chat too many stops": (
        "/v1/chat/completions",
        chat(stop=["a"] * 9),
        400,
        "--max-stop-strings",
    ),
    # --- OpenAI completions
    "completions 2000 prompts": (
        "/v1/completions",
        {"prompt": ["Hi"] * 2000, "max_tokens": 1},
        400,
        "--max-sequences-per-request",
    ),
    "completions prompts times n": (
        "/v1/completions",
        {"prompt": ["Hi"] * 4, "n": 8, "max_tokens": 1},
        400,
        "32 sequences",
    ),
    "completions empty prompt list": ("/v1/completions", {"prompt": []}, 400, "prompt"),
    "completions logprobs absurd": (
        "/v1/completions",
        {"prompt": "Hi", "logprobs": 10**6},
        400,
        "logprobs",
    ),
    "completions prompt over max chars": (
        "/v1/completions",
        {"prompt": "a" * (PROMPT_CHARS + 1)},
        400,
        PROMPT_OVER_LIMIT,
    ),
    # --- other routes
    "tokenize over max chars": (
        "/tokenize",
        {"prompt": "a" * (PROMPT_CHARS + 1)},
        400,
        PROMPT_OVER_LIMIT,
    ),
    "tokenize wrong type": ("/tokenize", {"prompt": 5}, 400, "prompt must be"),
    "detokenize out of vocab": ("/detokenize", {"tokens": [10**9]}, 400, "outside the vocabulary"),
    "abort rid wrong type": ("/abort_request", {"rid": 5}, 400, "rid must be a string"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refused_with_a_precise_error(http, name):
    route, body, status, fragment = CASES[name]
    if isinstance(body, bytes):
        r = http.post(route, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(route, json=body)
    assert_error(r, status, fragment)
    assert_still_serving(http)


GRAMMAR_CASES = {
    "invalid regex": {"regex": "(unclosed"},
    "invalid ebnf": {"ebnf": "root ::= undefined_rule"},
    "invalid json schema": {"json_schema": {"type": "wat"}},
}


# Extreme values that are still valid: served, not refused (and nothing breaks downstream).
ACCEPTED: dict[str, dict[str, Any]] = {
    "seed beyond 64 bits": gen(seed=10**30),
    "negative seed": gen(seed=-7),
    "top_k beyond the vocabulary": gen(top_k=10**18),
    "temperature at its maximum": gen(temperature=100),
    "logit_bias at its bounds": gen(logit_bias={"0": -100, "1": 100}),
    "max_new_tokens as a whole float": gen(max_new_tokens=1.0),
    "stop strings at both limits": gen(stop=["x" * STOP_CHARS] * STOPS, max_new_tokens=4),
    "batch x n at the limit": {
        "text": ["Hi", "Yo", "Hey", "Ho"],
        "sampling_params": {"n": 2, "max_new_tokens": 1},
    },
}


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_extreme_but_valid_values_are_served(http, name):
    r = http.post("/generate", json=ACCEPTED[name])
    assert r.status_code == 200, r.text
    for out in r.json() if isinstance(r.json(), list) else [r.json()]:
        assert out["meta_info"]["finish_reason"]["type"] in ("length", "stop"), out
    assert_still_serving(http)


@needs_grammar
@pytest.mark.parametrize("name", list(GRAMMAR_CASES))
def test_invalid_grammar_is_400(http, name):
    r = http.post("/generate", json=gen(**GRAMMAR_CASES[name]))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]
    assert_still_serving(http)


def test_body_over_the_limit_is_413_from_content_length(srv, http):
    """Refused from the header alone: the server answers before a byte of the body is sent."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (BODY_LIMIT + 1))  # fmt: skip
        response = _read_response(sock)
    assert response.startswith("HTTP/1.1 413"), response[:200]
    error = json.loads(response.partition("\r\n\r\n")[2])["error"]
    assert error["message"] == (
        f"the request body is larger than {BODY_LIMIT} bytes (--max-request-body-bytes)"
    )
    assert error["type"] == "request_too_large" and error["code"] == 413
    assert_still_serving(http)


def _read_response(sock: socket.socket) -> str:
    """A whole HTTP/1.1 response (head and a Content-Length body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def test_chunked_body_over_the_limit_is_413_while_reading(srv, http):
    """No Content-Length: the server counts while reading and answers before the body ends."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: application/json\r\n\r\n")  # fmt: skip
        piece = b" " * 65536
        for _ in range(BODY_LIMIT // len(piece) + 1):  # just over the limit
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        head = _read_response(sock)  # the final 0-chunk never sent
    assert head.startswith("HTTP/1.1 413"), head[:200]
    assert "--max-request-body-bytes" in head
    assert_still_serving(http)


def test_slow_loris_is_408_and_does_not_block_others(srv, http):
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"text\": ")  # fmt: skip
        assert_still_serving(http)  # served while the slow body is pending
        assert http.get("/ping").status_code == 200
        head = _read_response(sock)
    assert head.startswith("HTTP/1.1 408"), head[:200]
    assert f"within {BODY_TIMEOUT_S} s (--request-body-timeout)" in head
    assert_still_serving(http)


def _probe_latencies(http: httpx.Client, stop: threading.Event) -> list[float]:
    latencies = []
    while not stop.is_set():
        for route in ("/ping", "/health"):
            t0 = time.perf_counter()
            assert http.get(route).status_code == 200
            latencies.append(time.perf_counter() - t0)
        time.sleep(0.02)
    return latencies


@pytest.mark.parametrize("route", ["/generate", "/v1/chat/completions"])
def test_probes_answer_fast_during_a_maximal_request(srv, http, route):
    """The largest body the limits allow (prompts at the character limit, each tokenized and
    then refused as too long for the context) keeps the CPU busy for seconds off the loop."""
    words = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. "
    prompt = (words * (PROMPT_CHARS // len(words) + 1))[:PROMPT_CHARS]
    if route == "/generate":  # as many prompts at the character limit as the body limit allows
        body: dict[str, Any] = {"text": [prompt] * (BODY_LIMIT // (PROMPT_CHARS + 8))}
        smallest = BODY_LIMIT - PROMPT_CHARS
    else:  # one chat at the character limit (rendered, then tokenized)
        body = {"messages": [{"role": "user", "content": prompt}]}
        smallest = PROMPT_CHARS
    raw = json.dumps(body).encode()
    assert smallest < len(raw) <= BODY_LIMIT
    result: dict[str, httpx.Response] = {}
    big = threading.Thread(target=lambda: result.update(r=http.post(route, content=raw)))
    with httpx.Client(base_url=srv.url, timeout=10) as probe:
        probe.get("/ping")  # connection open before the clock starts
        stop = threading.Event()
        big.start()
        latencies: list[float] = []
        prober = threading.Thread(target=lambda: latencies.extend(_probe_latencies(probe, stop)))
        prober.start()
        big.join(120)
        stop.set()
        prober.join(10)
    assert_error(result["r"], 400, "tokens; the maximum is")
    assert len(latencies) >= 6, "the maximal request finished before the probes could run"
    assert statistics.median(latencies) < 0.1, sorted(latencies)
    # a few slow outliers are the shared machine; most probes must be fast, and none may wait
    # out the tokenizing (a blocked loop shows as one probe as long as the whole tokenization:
    # 1.4 s for one chat at the limit, 5 s for the /generate batch, measured with it on the loop)
    assert sum(t < 0.1 for t in latencies) >= 0.8 * len(latencies), sorted(latencies)
    assert max(latencies) < 1.0, sorted(latencies)
    assert_still_serving(http)


def _in_flight(http: httpx.Client) -> int:
    st = http.get("/server_info").json()["internal_states"][0]
    return st["running_requests"] + st["waiting_requests"]


def _start_streams(srv: ServerProcess, rids: list[str]) -> list[threading.Thread]:
    def run(rid: str) -> None:
        body = {"text": "Story:", "sampling_params": LONG, "rid": rid, "stream": True}
        with httpx.stream("POST", srv.url + "/generate", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                pass

    threads = [threading.Thread(target=run, args=(rid,)) for rid in rids]
    for t in threads:
        t.start()
    return threads


def test_queue_full_is_429_with_retry_after(srv, http):
    threads = _start_streams(srv, [f"fill-{i}" for i in range(SEQUENCES)])  # 2 run, 6 wait
    try:
        wait_until(lambda: _in_flight(http) >= SEQUENCES, 60, what="a full queue")
        r = http.post("/generate", json=gen())
        assert_error(r, 429, "--max-queued-requests")
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "server_overloaded"
        again = http.post("/generate", json={**gen(), "rid": "fill-0"})
        assert_error(again, 400, "already in use")  # a duplicate rid is named before the queue
    finally:
        assert http.post("/abort_request", json={"abort_all": True}).status_code == 200
        for t in threads:
            t.join(60)
    wait_until(lambda: _in_flight(http) == 0, 30, what="the queue to drain")
    assert_still_serving(http)


def test_rid_of_a_running_request_is_refused(srv, http):
    threads = _start_streams(srv, ["busy-rid"])
    try:
        wait_until(lambda: _in_flight(http) >= 1, 60, what="the request to run")
        assert_error(http.post("/generate", json={**gen(), "rid": "busy-rid"}), 400,
                     "'busy-rid' is already in use")  # fmt: skip
    finally:
        http.post("/abort_request", json={"rid": "busy-rid"})
        for t in threads:
            t.join(60)
    assert_still_serving(http)


def test_disconnect_mid_stream_frees_the_request(srv, http):
    body = {"text": "Story:", "sampling_params": LONG, "stream": True}
    with httpx.stream("POST", srv.url + "/generate", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line).startswith("data: ")
    # the client left: the server aborts the request and frees its KV
    wait_until(lambda: _in_flight(http) == 0, 30, what="the abandoned request to be aborted")
    assert_still_serving(http)


def test_abort_storm(srv, http):
    threads = _start_streams(srv, [f"storm-{i}" for i in range(3)])
    wait_until(lambda: _in_flight(http) >= 3, 60, what="three requests in flight")
    bodies = [{"rid": f"storm-{i % 5}"} for i in range(40)] + [{"abort_all": True}] * 5
    statuses: list[int] = []

    def fire(chunk: list[dict]) -> None:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            statuses.extend(c.post("/abort_request", json=b).status_code for b in chunk)

    firing = [threading.Thread(target=fire, args=(bodies[k::5],)) for k in range(5)]
    for t in firing:
        t.start()
    for t in firing + threads:
        t.join(60)
    assert statuses == [200] * len(bodies)
    assert not any(t.is_alive() for t in threads)
    wait_until(lambda: _in_flight(http) == 0, 30, what="every aborted request to be gone")
    assert_still_serving(http)
