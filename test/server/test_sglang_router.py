"""The real SGLang router (`sglang-router`, cache-aware policy) in front of two RadixGen workers.

The router registers each worker through our SGLang routes (/health, /server_info, /model_info),
then forwards /generate as its own typed request (with `model`, `log_metrics`, ... set) and the
OpenAI routes as they come. A conversation's later turns must reach the worker whose radix cache
holds the earlier ones: there they find more cached tokens than the whole previous turn's prompt,
which the other worker cannot have.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import needs_grammar
from .router_process import RouterProcess
from .server_process import ServerProcess, server_flags

pytest.importorskip("sglang_router", reason="the SGLang router (test extra) is not installed")
pytestmark = pytest.mark.slow

WORKER_FLAGS = ("--max-total-tokens", "4096")


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[RouterProcess, list[ServerProcess]]]:
    # NOTE: both workers load at once; the router starts once they are healthy, since it checks
    # unready workers again only every 30 s
    workers = [ServerProcess(*server_flags(), *WORKER_FLAGS) for _ in range(2)]
    router = None
    try:
        for w in workers:
            w.wait_healthy()
        router = RouterProcess([w.url for w in workers])
        router.wait_workers(len(workers))
        yield router, workers
    finally:
        if router is not None:
            router.stop()
        for w in workers:
            w.stop()


@pytest.fixture(scope="module")
def rhttp(cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster[0].url, timeout=120.0) as client:
        yield client


def served_prompt_tokens(workers: list[ServerProcess]) -> list[int]:
    """Prompt tokens each worker has taken since it started (from its scheduler's counters)."""
    out = []
    for w in workers:
        r = httpx.get(w.url + "/server_info", timeout=30.0)
        assert r.status_code == 200, r.text
        out.append(r.json()["internal_states"][0]["prompt_tokens"])
    return out


def sse_events(client: httpx.Client, path: str, body: dict) -> list[dict]:
    events = []
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        events.append(json.loads(line[len("data: ") :]))
    return events


def test_router_registers_both_workers_with_our_model_info(cluster):
    router, workers = cluster
    listed = router.wait_workers(2)
    assert sorted(w["url"] for w in listed) == sorted(w.url for w in workers)
    info = httpx.get(workers[0].url + "/get_model_info", timeout=10.0).json()
    assert {w["model_id"] for w in listed} == {info["served_model_name"]}


def test_plain_requests_flow_through_the_router(rhttp):
    # NOTE: sampled at SGLang's default temperature, so EOS is ignored: " Paris." can end at 3
    body = {
        "text": "The capital of France is",
        "sampling_params": {"max_new_tokens": 4, "ignore_eos": True},
    }
    r = rhttp.post("/generate", json={**body, "rid": "router-plain-1"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta_info"]["id"] == "router-plain-1"
    assert out["meta_info"]["completion_tokens"] == 4 and out["text"]

    r = rhttp.post(
        "/v1/completions",
        json={"model": "m", "prompt": "One, two,", "max_tokens": 3, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    r = rhttp.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]


def test_bad_input_through_the_router_is_a_precise_400(rhttp):
    """The worker's 400 reaches the client as it was (the router checks only the types)."""
    r = rhttp.post(
        "/generate", json={"text": "x", "return_logprob": True, "top_logprobs_num": 1000}
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "top_logprobs_num"


def test_streamed_requests_flow_through_the_router(rhttp):
    events = sse_events(
        rhttp,
        "/generate",
        {"text": "Once upon a time", "stream": True,
         "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}},
    )  # fmt: skip
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert events[-1]["meta_info"]["completion_tokens"] == 5
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # cumulative text

    chunks = sse_events(
        rhttp,
        "/v1/chat/completions",
        # NOTE: greedy and ignore_eos: a sampled reply may end before max_tokens (CI saw "stop")
        {"messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 6,
         "temperature": 0, "ignore_eos": True, "stream": True},
    )  # fmt: skip
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


@needs_grammar
def test_constrained_requests_flow_through_the_router(rhttp):
    r = rhttp.post(
        "/generate",
        json={
            "text": "Is water wet? Answer:",
            "sampling_params": {"regex": "(yes|no)", "temperature": 0},
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["text"] in ("yes", "no")

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = rhttp.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Give a number as JSON."}],
            # NOTE: greedy: a sampled integer may run on for all 40 tokens (CI saw it cut off)
            "temperature": 0,
            "max_tokens": 40,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": schema},
            },
        },
    )
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"])["n"], int)


def test_conversations_return_to_the_worker_that_cached_them(cluster, rhttp):
    """Four conversations, three turns each. Each turn's four requests run at once, so the
    router's least-loaded choice spreads the first turns over both workers; later turns must
    follow their own conversation's cache."""
    _, workers = cluster
    topics = [
        "Roman aqueducts carried water over long distances",
        "Bees build hexagonal honeycomb cells from wax",
        "The sky looks blue by day and red at sunset",
        "Chess has special rules for castling",
    ]
    convs = [[{"role": "user", "content": f"{t}. Explain why."}] for t in topics]
    last_prompt = [0] * len(convs)

    def ask(i: int) -> dict:
        r = rhttp.post(
            "/v1/chat/completions",
            json={"messages": convs[i], "max_tokens": 6, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        return r.json()

    first_turn_split = None
    for turn in range(3):
        before = served_prompt_tokens(workers)
        with ThreadPoolExecutor(len(convs)) as pool:
            outs = list(pool.map(ask, range(len(convs))))
        after = served_prompt_tokens(workers)
        if turn == 0:
            first_turn_split = [a - b for a, b in zip(after, before, strict=True)]
        for i, out in enumerate(outs):
            usage = out["usage"]
            if turn > 0:
                # NOTE: the previous prompt and its answer are cached only where they ran
                assert usage["prompt_tokens_details"]["cached_tokens"] >= last_prompt[i], (
                    turn,
                    i,
                    usage,
                )
            last_prompt[i] = usage["prompt_tokens"]
            convs[i].append(
                {"role": "assistant", "content": out["choices"][0]["message"]["content"]}
            )
            convs[i].append({"role": "user", "content": f"And what about point {turn + 2}?"})
    assert first_turn_split is not None and all(n > 0 for n in first_turn_split), first_turn_split


def test_flush_cache_through_the_router_reaches_every_worker(rhttp):
    r = rhttp.post("/flush_cache")
    assert r.status_code == 200, r.text
    assert r.json()["workers_flushed"] == 2
