"""SGLang's names on the shared server: route aliases answer like the originals, and `/metrics`
carries SGLang's `sglang:` series whose counts match the requests made."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families
from wait_helpers import wait_until

from .conftest import needs_grammar


def scrape(http: httpx.Client) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics: (name, labels) -> value."""
    r = http.get("/metrics")
    assert r.status_code == 200
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there are none yet)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def labels_of(samples: dict, name: str) -> list[dict]:
    return [dict(ls) for (n, ls) in samples if n == name]


def generate(http: httpx.Client, text: str, n: int, stream: bool = False, **extra) -> dict:
    body = {
        "text": text,
        "stream": stream,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **extra},
    }
    if not stream:
        r = http.post("/generate", json=body)
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]
    last = None
    with http.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[len("data: ") :])
    assert last is not None
    return last["meta_info"]


def test_request_counters_match_the_requests_made(http):
    before = scrape(http)
    metas = [generate(http, "Counting tokens, one", 3), generate(http, "Counting tokens, two", 3)]
    after = scrape(http)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    plain = {"is_streaming": "false"}
    assert delta("sglang:num_requests_total", **plain) == 2
    assert delta("sglang:prompt_tokens_total", **plain) == sum(m["prompt_tokens"] for m in metas)
    assert delta("sglang:generation_tokens_total", **plain) == 6
    assert delta("sglang:time_to_first_token_seconds_count", **plain) == 2
    assert delta("sglang:e2e_request_latency_seconds_count", **plain) == 2
    assert delta("sglang:request_time_per_output_token_seconds_count", **plain) == 2
    assert delta("sglang:inter_token_latency_seconds_count") == 4  # per token after the first
    assert delta("sglang:prompt_tokens_histogram_count") == 2
    assert delta("sglang:generation_tokens_histogram_sum") == 6
    assert (
        0
        < delta("sglang:time_to_first_token_seconds_sum", **plain)
        <= delta("sglang:e2e_request_latency_seconds_sum", **plain)
    )
    assert delta("sglang:num_requests_total", is_streaming="true") == 0


def test_streamed_requests_are_labelled_streaming(http):
    before = scrape(http)
    meta = generate(http, "A streamed count", 4, stream=True)
    after = scrape(http)
    streamed = {"is_streaming": "true"}
    for name, expected in (
        ("sglang:num_requests_total", 1),
        ("sglang:generation_tokens_total", 4),
        ("sglang:prompt_tokens_total", meta["prompt_tokens"]),
        ("sglang:time_to_first_token_seconds_count", 1),
        ("sglang:e2e_request_latency_seconds_count", 1),
    ):
        assert value(after, name, **streamed) - value(before, name, **streamed) == expected, name
    itl = value(after, "sglang:inter_token_latency_seconds_count") - value(
        before, "sglang:inter_token_latency_seconds_count"
    )
    assert 1 <= itl <= 3  # the tokens after the first output (which may carry more than one)


def test_series_carry_sglang_labels(http):
    generate(http, "Labels please", 2)
    samples = scrape(http)
    model = http.get("/v1/models").json()["data"][0]["id"]
    for labels in labels_of(samples, "sglang:num_requests_total"):
        assert labels["model_name"] == model and labels["engine_type"] == "unified"
    (engine,) = labels_of(samples, "sglang:num_running_reqs")
    assert engine == {
        "model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
        "moe_ep_rank": "0",
    }  # fmt: skip


def test_engine_gauges_are_plausible(http):
    generate(http, "Gauges please", 2)

    def idle() -> dict | None:
        samples = scrape(http)
        return samples if value(samples, "sglang:num_running_reqs") == 0 else None

    samples = wait_until(idle, timeout=30, what="no running request")  # none of ours is in flight
    info = http.get("/server_info").json()
    assert value(samples, "sglang:num_queue_reqs") == 0
    assert value(samples, "sglang:num_grammar_queue_reqs") == 0
    assert 0 <= value(samples, "sglang:token_usage") <= 1
    assert 0 <= value(samples, "sglang:cache_hit_rate") <= 1
    total = value(samples, "sglang:max_total_num_tokens")
    assert total == info["internal_states"][0]["max_total_num_tokens"] > 0
    used = value(samples, "sglang:num_used_tokens")
    assert used + value(samples, "sglang:kv_available_tokens") == total
    assert value(samples, "sglang:context_len") == info["max_context_length"]
    assert value(samples, "sglang:page_size") == info["page_size"]
    assert value(samples, "sglang:gen_throughput") >= 0
    assert value(samples, "sglang:num_retracted_requests_total") >= 0


def test_cached_tokens_are_counted_as_the_cache_served_them(http):
    text = "The same long prompt, twice, so that the radix cache serves it the second time."
    generate(http, text, 1)
    before = scrape(http)
    meta = generate(http, text, 1)
    after = scrape(http)
    assert meta["cached_tokens"] > 0
    name, labels = "sglang:cached_tokens_total", {"cache_source": "device"}
    assert value(after, name, **labels) - value(before, name, **labels) == meta["cached_tokens"]


@needs_grammar
def test_structured_output_requests_are_counted(http):
    before = value(scrape(http), "sglang:num_so_requests_total")
    generate(http, "Yes or no? ", 2, regex="(yes|no)")
    generate(http, "Free text ", 2)
    assert value(scrape(http), "sglang:num_so_requests_total") - before == 1


def test_our_series_stay_beside_sglang_ones(http):
    body = http.get("/metrics").text
    assert "radixgen_requests_total" in body and "sglang:num_requests_total" in body


# --- route aliases -----------------------------------------------------------------------------


def test_model_info_alias_answers_like_the_original(http):
    a, b = http.get("/get_model_info"), http.get("/model_info")
    assert a.status_code == b.status_code == 200
    assert a.json() == b.json() and a.json()["model_path"]


def test_server_info_alias_answers_like_the_original(http):
    a, b = http.get("/get_server_info").json(), http.get("/server_info").json()
    assert a.keys() == b.keys()
    for key in ("model_path", "version", "max_context_length", "tool_call_parser", "tp_size"):
        assert a[key] == b[key], key


def test_tokenize_aliases_answer_alike(http):
    body = {"prompt": "alias check"}
    a, b = http.post("/tokenize", json=body), http.post("/v1/tokenize", json=body)
    assert a.status_code == b.status_code == 200 and a.json() == b.json()


def test_invocations_is_chat_completions(http):
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    a, b = http.post("/invocations", json=body), http.post("/v1/chat/completions", json=body)
    assert a.status_code == b.status_code == 200
    assert a.json()["object"] == "chat.completion"
    assert a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]
    bad = http.post("/invocations", json={"messages": "not a list"})
    assert bad.status_code == 400 and bad.json()["error"]["message"]


def test_root_answers_like_sglang(http):
    r = http.get("/")
    assert r.status_code == 200 and r.json() == "RadixGen is running"
    assert http.head("/").status_code == 200
