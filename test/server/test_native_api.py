"""SGLang's native HTTP API against the real server: shapes, batching, logprobs, streaming, errors."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time

import httpx
import pytest
from wait_helpers import wait_until

from .conftest import needs_grammar
from .server_process import grammar_available

GREEDY = {"temperature": 0, "max_new_tokens": 6}


def generate(http: httpx.Client, **body) -> httpx.Response:
    return http.post("/generate", json=body)


def engine_state(http: httpx.Client) -> dict:
    return http.get("/server_info").json()["internal_states"][0]


def wait_idle(http: httpx.Client, timeout: float = 10.0) -> dict:
    def idle() -> dict | None:
        st = engine_state(http)
        return st if st["running_requests"] == 0 and st["waiting_requests"] == 0 else None

    return wait_until(idle, timeout, what="the engine to be idle")


def wait_decoding(http: httpx.Client, generated_before: int, n: int = 1) -> None:
    """Until `n` requests are running and at least one new token was generated."""

    def decoding() -> bool:
        st = engine_state(http)
        return st["running_requests"] >= n and st["generated_tokens"] > generated_before

    wait_until(decoding, 60, what=f"{n} request(s) to be decoding")


def sse_events(lines) -> list:
    events = []
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_generate_single_shape(http):
    r = generate(http, text="The capital of France is", sampling_params=GREEDY)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    out = r.json()
    meta = out["meta_info"]
    assert isinstance(out["text"], str) and out["text"]
    assert len(out["output_ids"]) == meta["completion_tokens"] == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == 5
    for key in ("id", "cached_tokens", "e2e_latency"):
        assert key in meta


def test_batch_is_a_list_in_order(http):
    prompts = ["One, two, three,", "The capital of France is", "def add(a, b):"]
    batch = generate(http, text=prompts, sampling_params=GREEDY).json()
    assert isinstance(batch, list) and len(batch) == 3
    for prompt, item in zip(prompts, batch, strict=True):
        single = generate(http, text=prompt, sampling_params=GREEDY).json()
        assert item["text"] == single["text"]


def test_input_ids_and_per_item_sampling_params(http):
    ids = http.post("/tokenize", json={"prompt": "Hello there"}).json()["tokens"]
    out = generate(http, input_ids=ids, sampling_params=GREEDY).json()
    assert out["meta_info"]["prompt_tokens"] == len(ids)
    batch = generate(
        http,
        input_ids=[ids, ids],
        sampling_params=[
            {"max_new_tokens": 1, "temperature": 0},
            {"max_new_tokens": 3, "temperature": 0},
        ],
    ).json()
    assert [b["meta_info"]["completion_tokens"] for b in batch] == [1, 3]


def test_frontend_style_params_with_nulls(http):
    """The body SGLang's RuntimeEndpoint sends: explicit nulls, top_k -1, stop as a list."""
    sp = {
        "skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 4,
        "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [],
        "temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
        "presence_penalty": 0.0, "ignore_eos": False, "regex": None, "json_schema": None,
    }  # fmt: skip
    r = generate(http, text="Hi", sampling_params=sp)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 4


def test_stop_string_is_trimmed(http):
    full = generate(
        http, text="One, two, three, four,", sampling_params={**GREEDY, "max_new_tokens": 10}
    ).json()
    text = full["text"]
    stop = text[3:6] if len(text) >= 6 else text[-2:]
    assert stop.strip(), text
    for given in (stop, [stop, "zzzz"]):
        out = generate(
            http, text="One, two, three, four,",
            sampling_params={**GREEDY, "max_new_tokens": 10, "stop": given},
        ).json()  # fmt: skip
        assert out["text"] == text[: text.find(stop)]
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_prefill_only(http):
    out = generate(
        http, text="Warm the cache with this prefix", sampling_params={"max_new_tokens": 0}
    ).json()
    assert out["text"] == "" and out["output_ids"] == []
    assert out["meta_info"]["completion_tokens"] == 0
    again = generate(
        http, text="Warm the cache with this prefix", sampling_params={"max_new_tokens": 0}
    ).json()
    assert again["meta_info"]["cached_tokens"] > 0


def test_input_logprobs_first_entry_null(http):
    text = "The quick brown fox jumps"
    n = len(http.post("/tokenize", json={"prompt": text}).json()["tokens"])
    out = generate(
        http, text=text, sampling_params={"max_new_tokens": 0}, return_logprob=True,
        logprob_start_len=0, return_text_in_logprobs=True, top_logprobs_num=2,
    ).json()  # fmt: skip
    lps = out["meta_info"]["input_token_logprobs"]
    assert len(lps) == n
    assert lps[0][0] is None and lps[0][2] == "The"
    assert all(isinstance(e[0], float) and e[0] <= 0 and isinstance(e[1], int) for e in lps[1:])
    assert "".join(e[2] for e in lps) == text
    tops = out["meta_info"]["input_top_logprobs"]
    assert tops[0] is None and all(len(row) == 2 for row in tops[1:])
    later = generate(
        http, text=text, sampling_params={"max_new_tokens": 0}, return_logprob=True,
        logprob_start_len=2,
    ).json()["meta_info"]["input_token_logprobs"]  # fmt: skip
    assert len(later) == n - 2 and later[0][0] is None and later[0][2] is None
    assert later[1][0] == pytest.approx(lps[3][0], abs=1e-3)


def test_select_style_batch_scoring(http):
    """What RuntimeEndpoint.select sends: a prefill-only batch with logprobs from a start."""
    prefix = "Q: Is the sky blue? A:"
    p = generate(http, text=prefix, sampling_params={"max_new_tokens": 0}).json()["meta_info"][
        "prompt_tokens"
    ]
    out = generate(
        http, text=[prefix + " Yes", prefix + " No"], sampling_params={"max_new_tokens": 0, "temperature": 0},
        return_logprob=True, return_text_in_logprobs=True, logprob_start_len=max(p - 2, 0),
    ).json()  # fmt: skip
    assert len(out) == 2
    for item in out:
        meta = item["meta_info"]
        assert meta["input_token_logprobs"][0][0] is None
        assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"] - max(p - 2, 0)
        assert meta["output_token_logprobs"] == []


def test_output_logprobs_and_n(http):
    out = generate(
        http, text="Hello", sampling_params={"max_new_tokens": 3, "n": 2, "temperature": 0.8},
        return_logprob=True, top_logprobs_num=3,
    ).json()  # fmt: skip
    assert isinstance(out, list) and len(out) == 2
    for item in out:
        meta = item["meta_info"]
        assert len(meta["output_token_logprobs"]) == meta["output_token_logprobs_length"] == 3
        assert meta["input_token_logprobs"] == []
        assert all(len(row) == 3 for row in meta["output_top_logprobs"])


def test_streaming_framing(http):
    body = {
        "text": "Count: 1, 2, 3,", "stream": True, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
    }  # fmt: skip
    arrivals = []
    with http.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if line:
                arrivals.append(time.monotonic())
    events = sse_events(lines)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 4, "one chunk per decode step, not one burst"
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts)), "text is cumulative"
    prev = 0
    for c in chunks:
        meta = c["meta_info"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - prev, (
            "delta logprobs"
        )
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"]
        prev = meta["completion_tokens"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    final = generate(http, text=body["text"], sampling_params=body["sampling_params"]).json()
    assert texts[-1] == final["text"]
    assert arrivals[-2] - arrivals[0] > 0.005, "chunks are paced by decode steps"


def test_stream_error_event(http):
    """Validation errors come back before the stream starts, with a 4xx status."""
    r = http.post("/generate", json={"text": "x", "stream": True, "sampling_params": {"top_p": 0}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "top_p"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text": "x", "bogus": 1}, "bogus"),
        ({"text": "x", "sampling_params": {"temperature": -1}}, "temperature"),
        ({"text": "x", "sampling_params": {"max_new_tokens": "many"}}, "max_new_tokens"),
        ({"text": "x", "sampling_params": {"nope": 1}}, "nope"),
        ({"text": ""}, "text"),
        ({}, "text"),
        ({"text": "x", "input_ids": [1]}, "text"),
        ({"input_ids": [10**9]}, "input_ids"),
        ({"text": "x " * 9000}, "text"),
        ({"text": "x", "sampling_params": {"max_new_tokens": 10**6}}, "max_new_tokens"),
        ({"text": "x", "image_data": "aGVsbG8="}, "image_data"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
        ({"text": "x", "return_logprob": True, "logprob_start_len": 5}, "logprob_start_len"),
    ],
)
def test_bad_input_is_a_precise_400(http, body, param):
    r = http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["code"] == 400
    assert err["message"]


def test_malformed_json_and_unknown_route(http):
    r = http.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = http.get("/no/such/route")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def _abort_long_request(http, base_url: str, rid: str, **params) -> object:
    """Start a 2000-token request in the background, abort it by `rid`, return its JSON reply."""
    result = {}
    body = {
        "text": "Tell me a long story", "rid": rid,
        "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True, **params},
    }  # fmt: skip

    def run():
        with httpx.Client(base_url=base_url, timeout=60) as c:
            result["r"] = c.post("/generate", json=body)

    before = engine_state(http)["generated_tokens"]
    t = threading.Thread(target=run)
    t.start()
    wait_decoding(http, before, params.get("n", 1))  # every sample is in flight
    assert http.post("/abort_request", json={"rid": rid}).status_code == 200
    t.join(30)
    return result["r"].json()


def test_abort_request_by_rid(http, base_url):
    out = _abort_long_request(http, base_url, "abort-me")
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["completion_tokens"] < 2000
    assert http.post("/abort_request", json={}).status_code == 400


def test_abort_request_by_rid_aborts_every_sample_of_n(http, base_url):
    outs = _abort_long_request(http, base_url, "abort-n", n=2, temperature=0.8)
    assert isinstance(outs, list) and len(outs) == 2
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert out["meta_info"]["completion_tokens"] < 2000


def _send_raw_request(base_url: str, body: dict) -> socket.socket:
    """A POST on a plain socket, so the test can hang up before any response byte arrives."""
    host, port = base_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_aborts_and_frees_kv(http, base_url, stream):
    body = {
        "text": "Write a very long essay about the sea", "stream": stream,
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
    }  # fmt: skip
    before = engine_state(http)["generated_tokens"]
    sock = _send_raw_request(base_url, body)
    wait_decoding(http, before)
    if stream:
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
    sock.close()
    st = wait_idle(http)
    assert st["running_requests"] == 0 and st["waiting_requests"] == 0
    assert st["cache_protected_tokens"] == 0, "no KV still locked by the dead request"
    assert st["generated_tokens"] - before < 3000


def test_health_and_info(http):
    assert http.get("/health").status_code == 200
    assert http.get("/health_generate").status_code == 200
    for path in ("/get_model_info", "/model_info"):
        info = http.get(path).json()
        assert info["model_path"] and info["is_generation"] is True
    for path in ("/get_server_info", "/server_info"):
        info = http.get(path).json()
        assert info["version"] and info["max_total_num_tokens"] > 0
        assert (
            isinstance(info["internal_states"], list) and "kv_usage" in info["internal_states"][0]
        )
        assert "api_key" not in info
        assert info["port"] == int(http.base_url.port)


def test_flush_cache(http, base_url):
    assert http.post("/flush_cache").status_code == 200
    assert http.get("/flush_cache").status_code == 200
    done = threading.Event()

    def run():
        with httpx.Client(base_url=base_url, timeout=60) as c:
            c.post(
                "/generate",
                json={
                    "text": "Long",
                    "rid": "busy",
                    "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
                },
            )
        done.set()

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: engine_state(http)["running_requests"], 60, what="the request to be running")
    refused = http.post("/flush_cache")
    http.post("/abort_request", json={"rid": "busy"})
    t.join(30)
    assert refused.status_code == 400 and "in flight" in refused.text


def test_tokenize_detokenize_and_no_op_routes(http):
    for prefix in ("", "/v1"):
        tok = http.post(prefix + "/tokenize", json={"prompt": "Hello world"}).json()
        assert tok["count"] == len(tok["tokens"]) > 0
        text = http.post(prefix + "/detokenize", json={"tokens": tok["tokens"]}).json()["text"]
        assert text == "Hello world"
    assert http.post("/detokenize", json={"tokens": [-1]}).status_code == 400
    assert (
        http.post(
            "/concate_and_append_request", json={"src_rids": ["a"], "dst_rid": "b"}
        ).status_code
        == 200
    )


def test_metrics(http):
    generate(http, text="metrics please", sampling_params={"max_new_tokens": 2})
    r = http.get("/metrics")
    assert r.status_code == 200
    body = r.text
    for name in (
        "radixgen_requests_total", "radixgen_prompt_tokens_total", "radixgen_generation_tokens_total",
        "radixgen_time_to_first_token_seconds_bucket", "radixgen_e2e_request_latency_seconds_bucket",
        "radixgen_inter_token_latency_seconds_bucket", "radixgen_num_running_reqs",
        "radixgen_num_queue_reqs", "radixgen_token_usage", "radixgen_cache_hit_rate",
    ):  # fmt: skip
        assert name in body, name
    if grammar_available():
        assert "radixgen_grammar_compile_seconds_total" in body


def _metric(http, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_metrics_count_n_samples_not_the_internal_prompt_prefill(http):
    before = _metric(http, "radixgen_requests_received_total")
    out = generate(
        http, text="Two samples please", sampling_params={"max_new_tokens": 2, "n": 2}
    ).json()
    assert len(out) == 2
    assert _metric(http, "radixgen_requests_received_total") - before == 2


@needs_grammar
@pytest.mark.parametrize("stream", [False, True])
def test_bad_grammar_is_a_400_before_any_stream(http, stream):
    body = {
        "text": "x",
        "stream": stream,
        "sampling_params": {"regex": "(unclosed", "max_new_tokens": 4},
    }
    r = http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


@needs_grammar
def test_regex_and_json_schema_through_generate(http):
    out = generate(
        http,
        text="The answer is ",
        sampling_params={"regex": "(yes|no)", "max_new_tokens": 4, "temperature": 0},
    ).json()
    assert out["text"] in ("yes", "no")
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
    }
    out = generate(
        http, text="Is water wet? JSON: ",
        sampling_params={"json_schema": json.dumps(schema), "max_new_tokens": 24, "temperature": 0},
    ).json()  # fmt: skip
    assert json.loads(out["text"])["answer"] in ("yes", "no")


def test_metrics_time_to_first_token_covers_requests_that_are_not_streamed(http):
    ttft = "radixgen_time_to_first_token_seconds_count"
    itl = "radixgen_inter_token_latency_seconds_count"
    before = (_metric(http, ttft), _metric(http, itl))
    generate(http, text="No stream here", sampling_params={"max_new_tokens": 4, "ignore_eos": True})
    assert _metric(http, ttft) == before[0] + 1
    assert _metric(http, itl) == before[1] + 1
