"""`--dp-size 2`: two scheduler replicas (own KV pool, radix cache, grammar manager) behind the
API process's DP controller, cache-aware routing. Which replica served a request is read from
each replica's own counters in `/server_info` (one `internal_states` entry per replica)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .server_process import ServerProcess, running_server, server_flags

pytestmark = pytest.mark.slow

# two long prompts with nothing in common (the model's BOS aside)
AQUEDUCTS = (
    "Roman aqueducts carried water across valleys on stone arches, and their engineers set the "
    "slope of each channel with great care so the flow never stopped. "
)
BEES = (
    "Bees build hexagonal honeycomb cells from wax made by glands on their abdomen, and they "
    "store honey and pollen in them for the winter months. "
)


@pytest.fixture(scope="module")
def dp_server():
    with running_server(
        *server_flags(), "--enable-metrics", "--max-total-tokens", "4096",
        "--dp-size", "2", "--load-balance-method", "cache_aware",
    ) as proc:  # fmt: skip
        yield proc


@pytest.fixture(scope="module")
def dhttp(dp_server):
    with httpx.Client(base_url=dp_server.url, timeout=120.0) as client:
        yield client


def replica_states(http: httpx.Client) -> list[dict]:
    r = http.get("/server_info")
    assert r.status_code == 200, r.text
    return r.json()["internal_states"]


def generate(http: httpx.Client, text: str, **extra) -> tuple[dict, int]:
    """One request; returns its meta_info and the replica that took its prompt."""
    before = [s["prompt_tokens"] for s in replica_states(http)]
    body = {"text": text, "sampling_params": {"max_new_tokens": 3}, **extra}
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    after = [s["prompt_tokens"] for s in replica_states(http)]
    grew = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a > b]
    assert len(grew) == 1, (before, after)
    return r.json()["meta_info"], grew[0]


def test_two_replicas_report_and_serve_health(dp_server, dhttp):
    states = replica_states(dhttp)
    assert len(states) == 2
    assert all(s["max_total_num_tokens"] == 4096 for s in states)
    info = dhttp.get("/server_info").json()
    assert info["dp_size"] == 2 and info["load_balance_method"] == "cache_aware"
    assert dhttp.get("/health").status_code == 200
    assert dhttp.get("/health_generate").status_code == 200
    # 2 schedulers + the detokenizer (each may own grammar compile workers below it)
    roles = [" ".join(p.cmdline()) for p in _children(dp_server)]
    assert sum("child_main scheduler" in c for c in roles) == 2
    assert sum("child_main detokenizer" in c for c in roles) == 1


def _children(server: ServerProcess):
    import psutil

    return psutil.Process(server.proc.pid).children()


def test_shared_prefixes_go_to_the_replica_holding_them(dhttp):
    first, home_a = generate(dhttp, AQUEDUCTS + "Why did it work?")
    _, home_b = generate(dhttp, BEES + "How do they do it?")
    assert home_a != home_b  # no shared prefix: the replica with less cached goes next
    again_a, rank = generate(dhttp, AQUEDUCTS + "Who built them?")
    assert rank == home_a
    assert again_a["cached_tokens"] >= first["prompt_tokens"] - 8  # the shared part, cached
    again_b, rank = generate(dhttp, BEES + "Where do they live?")
    assert rank == home_b and again_b["cached_tokens"] > 0


def test_an_explicit_replica_is_honoured_and_checked(dhttp):
    _, home_b = generate(dhttp, BEES + "How do they do it?")
    _, rank = generate(dhttp, BEES + "How do they do it?", data_parallel_rank=1 - home_b)
    assert rank == 1 - home_b  # the policy would have chosen home_b (the whole prompt is there)
    r = dhttp.post("/generate", json={"text": "x", "data_parallel_rank": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "data_parallel_rank"


def test_n_samples_follow_their_cached_prompt(dhttp):
    r = dhttp.post(
        "/generate",
        json={"text": AQUEDUCTS + "List three facts.",
              "sampling_params": {"max_new_tokens": 2, "n": 3, "temperature": 1.0}},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    metas = [item["meta_info"] for item in r.json()]
    assert len(metas) == 3
    assert all(m["cached_tokens"] >= m["prompt_tokens"] - 1 for m in metas)


def _stream_until_aborted(url: str, rid: str, rank: int, out: dict, started: threading.Event):
    body = {"text": "Count on: 1, 2,", "rid": rid, "stream": True, "data_parallel_rank": rank,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}  # fmt: skip
    with (
        httpx.Client(timeout=120.0) as client,
        client.stream("POST", url + "/generate", json=body) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: {"):
                out[rid] = json.loads(line[len("data: ") :])["meta_info"]
                started.set()


def test_abort_reaches_the_replica_running_the_request(dp_server, dhttp):
    """The same prompt on both replicas (asked explicitly): each abort stops only its own."""
    out: dict = {}
    events = {rid: threading.Event() for rid in ("dp-long-0", "dp-long-1")}
    threads = [
        threading.Thread(target=_stream_until_aborted, args=(dp_server.url, rid, rank, out, ev))
        for rank, (rid, ev) in enumerate(events.items())
    ]
    for t in threads:
        t.start()
    assert all(ev.wait(60) for ev in events.values())
    running = [s["running_requests"] for s in replica_states(dhttp)]
    assert running == [1, 1], running
    for rank, (rid, t) in enumerate(zip(events, threads, strict=True)):
        assert dhttp.post("/abort_request", json={"rid": rid}).status_code == 200
        t.join(30)
        assert out[rid]["finish_reason"]["type"] == "abort", out[rid]
        deadline = time.monotonic() + 10
        while replica_states(dhttp)[rank]["running_requests"]:
            assert time.monotonic() < deadline, replica_states(dhttp)
            time.sleep(0.1)
        if rank == 0:  # the other one still runs
            assert replica_states(dhttp)[1]["running_requests"] == 1


def test_metrics_sum_the_replicas_and_flush_reaches_both(dhttp):
    states = replica_states(dhttp)
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(dhttp.get("/metrics").text)
        for s in family.samples
    }
    assert samples["radixgen_scheduler_prompt_tokens"] >= sum(s["prompt_tokens"] for s in states)
    assert samples["radixgen_scheduler_prompt_tokens"] > max(s["prompt_tokens"] for s in states)
    r = dhttp.post("/flush_cache")
    assert r.status_code == 200, r.text
    assert all(s["cache_evictable_tokens"] == 0 for s in replica_states(dhttp))


def test_the_sglang_router_in_dp_aware_mode_targets_each_replica(dp_server, dhttp):
    """`--dp-aware`: the router reads our dp_size from /server_info, registers one worker per
    replica (`url@rank`) and sends `data_parallel_rank` with every request, native or OpenAI."""
    pytest.importorskip("sglang_router", reason="the SGLang router (test extra) is not installed")
    from .router_process import RouterProcess

    router = RouterProcess([dp_server.url], "--dp-aware", "--policy", "round_robin")
    try:
        workers = router.wait_workers(2)
        assert sorted(w["url"] for w in workers) == [f"{dp_server.url}@0", f"{dp_server.url}@1"]
        with httpx.Client(base_url=router.url, timeout=120.0) as client:
            before = [s["prompt_tokens"] for s in replica_states(dhttp)]
            for i in range(2):  # round robin over the replicas: each gets a chat and a /generate
                r = client.post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 2},
                )
                assert r.status_code == 200, r.text
                r = client.post(
                    "/generate", json={"text": f"Hey {i}", "sampling_params": {"max_new_tokens": 2}}
                )
                assert r.status_code == 200, r.text
            after = [s["prompt_tokens"] for s in replica_states(dhttp)]
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    finally:
        router.stop()


def _stream_text(url: str, body: dict) -> tuple[str, dict]:
    """A streamed /generate: its final cumulative text and meta_info (chunks that a slow
    reader falls behind on may arrive merged, so their number is not fixed)."""
    chunks = []
    with httpx.Client(timeout=120.0) as c, c.stream("POST", url + "/generate", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks[-1]["text"], chunks[-1]["meta_info"]


def test_concurrent_streams_are_spread_and_match_the_unstreamed_answers(dp_server, dhttp):
    """Four streams at once over two replicas: both replicas serve, and every stream ends with
    the text the same greedy request gets unstreamed (whichever replica runs it)."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"{topic} Tell me more." for topic in (AQUEDUCTS, BEES, "Chess openings:", "Tea:")]
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    before = [s["prompt_tokens"] for s in replica_states(dhttp)]
    with ThreadPoolExecutor(4) as pool:
        streamed = list(
            pool.map(
                lambda p: _stream_text(
                    dp_server.url, {"text": p, "stream": True, "sampling_params": params}
                ),
                prompts,
            )
        )
    after = [s["prompt_tokens"] for s in replica_states(dhttp)]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    for p, (text, meta) in zip(prompts, streamed, strict=True):
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 8
        r = dhttp.post("/generate", json={"text": p, "sampling_params": params})
        assert r.status_code == 200 and r.json()["text"] == text


def test_constrained_decoding_on_each_replica(dhttp):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    texts = []
    for rank in (0, 1):
        body = {"text": "A JSON object with a number n:", "data_parallel_rank": rank,
                "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                    "json_schema": json.dumps(schema)}}  # fmt: skip
        r = dhttp.post("/generate", json=body)
        assert r.status_code == 200, r.text
        assert isinstance(json.loads(r.json()["text"])["n"], int)
        texts.append(r.json()["text"])
    assert texts[0] == texts[1]  # each replica's own grammar manager, the same answer


def test_each_conversation_stays_on_the_replica_that_cached_it(dhttp):
    """Two chats, three turns each, asked in turn, their first turns on different replicas:
    every later turn, routed by the policy, goes where its conversation's earlier turns ran (its
    history is cached there), not to the other replica."""
    convs = [
        [{"role": "system", "content": "You are a historian of Roman engineering."},
         {"role": "user", "content": AQUEDUCTS + "Why did it work?"}],
        [{"role": "system", "content": "You are a beekeeper who answers briefly."},
         {"role": "user", "content": BEES + "How do they do it?"}],
    ]  # fmt: skip
    homes: list[set[int]] = [set(), set()]
    for turn in range(3):
        for i, conv in enumerate(convs):
            before = [s["prompt_tokens"] for s in replica_states(dhttp)]
            body = {"messages": conv, "max_tokens": 4, "temperature": 0}
            if turn == 0:  # the first turns go apart (what the policy would do on a fresh
                body["data_parallel_rank"] = i  # server; here earlier tests' load decides)
            r = dhttp.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            after = [s["prompt_tokens"] for s in replica_states(dhttp)]
            homes[i] |= {k for k, (a, b) in enumerate(zip(after, before, strict=True)) if a > b}
            usage = r.json()["usage"]
            if turn > 0:  # the previous turns, cached where they ran
                assert usage["prompt_tokens_details"]["cached_tokens"] > 30, usage
            conv.append(
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
            )
            conv.append({"role": "user", "content": f"And point {turn + 2}?"})
    assert homes == [{0}, {1}], homes
