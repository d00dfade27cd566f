"""`radixgen router` in front of a generation server (the default model), the embedding server
(all-MiniLM-L6-v2) and two servers of one tiny cross-encoder: each request reaches a worker of
the model it names, answers are the workers' own (streams too), the cache-aware policy keeps one
rerank query on one worker, and refusals, a dead worker, the API key and a client that leaves
are handled as a server would.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from server.router_process import ModelRouterProcess as ModelRouter
from server.server_process import ServerProcess, running_server, server_flags

pytestmark = pytest.mark.slow

GEN_FLAGS = ("--max-total-tokens", "4096")
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def generation_server() -> Iterator[ServerProcess]:
    with running_server(*server_flags(), *GEN_FLAGS) as proc:
        yield proc


@pytest.fixture(scope="module")
def second_rerank_server(cross_encoder_folder) -> Iterator[ServerProcess]:
    with running_server("--model-path", str(cross_encoder_folder), *server_flags()) as proc:
        yield proc


@pytest.fixture(scope="module")
def router(generation_server, embedding_server, rerank_server, second_rerank_server):
    urls = [
        generation_server.url,
        embedding_server.url,
        rerank_server.url,
        second_rerank_server.url,
    ]
    proc = ModelRouter(urls)
    try:
        proc.wait_workers(4)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def rclient(router) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=router.url, timeout=120.0) as client:
        yield client


def model_of(server: ServerProcess) -> str:
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


def test_models_and_workers_listed(router, rclient, generation_server, embedding_server):
    ids = [c["id"] for c in rclient.get("/v1/models").json()["data"]]
    assert model_of(generation_server) in ids
    assert model_of(embedding_server) in ids
    assert len(ids) == 3  # the two cross-encoder servers serve one model
    kinds = {url: w["kind"] for url, w in router.workers().items()}
    assert kinds[generation_server.url] == "generation"
    assert kinds[embedding_server.url] == "embedding"
    assert rclient.get("/health").status_code == 200


def test_chat_reaches_the_generation_worker(router, rclient, generation_server):
    import openai

    model = model_of(generation_server)
    via = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=generation_server.url + "/v1", api_key="unused", max_retries=0)
    args = {"model": model, "messages": CHAT, "max_tokens": 12, "temperature": 0}
    before = router.workers()[generation_server.url]["dispatched"]
    routed = via.chat.completions.create(**args)
    alone = direct.chat.completions.create(**args)
    assert routed.choices[0].message.content == alone.choices[0].message.content
    assert routed.usage.completion_tokens == alone.usage.completion_tokens
    assert router.workers()[generation_server.url]["dispatched"] == before + 1
    start = time.monotonic()
    story = {**args, "messages": [{"role": "user", "content": "Write a long story about a cat."}]}
    story["max_tokens"] = 64
    stream = via.chat.completions.create(**story, stream=True)
    chunks, first_at = [], None
    for c in stream:
        if c.choices and c.choices[0].delta.content:
            first_at = first_at or time.monotonic() - start
            chunks.append(c.choices[0].delta.content)
    total = time.monotonic() - start
    assert first_at is not None and first_at < total / 2  # passed on as it came, not buffered
    longer = direct.chat.completions.create(**story)
    assert longer.usage.completion_tokens > 32
    assert "".join(chunks) == longer.choices[0].message.content
    # SGLang's native route, no `model`: the only generation model takes it
    r = rclient.post("/generate", json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}})  # fmt: skip
    assert r.status_code == 200 and r.json()["text"]


def test_embeddings_reach_the_embedding_worker(router, rclient, embedding_server):
    model = model_of(embedding_server)
    body = {"model": model, "input": ["a cat on a mat", "retrieval for RAG"]}
    routed = rclient.post("/v1/embeddings", json=body).json()
    alone = httpx.post(embedding_server.url + "/v1/embeddings", json=body, timeout=60).json()
    for got, want in zip(routed["data"], alone["data"], strict=True):
        assert got["embedding"] == pytest.approx(want["embedding"], abs=1e-6)
    encoded = rclient.post("/encode", json={"model": model, "text": "a cat on a mat"})
    assert encoded.status_code == 200
    assert encoded.json()["embedding"] == pytest.approx(routed["data"][0]["embedding"], abs=1e-6)


def test_cache_aware_keeps_a_query_on_one_worker(router, rclient, rerank_server, second_rerank_server):  # fmt: skip
    model = model_of(rerank_server)
    pair = (rerank_server.url, second_rerank_server.url)
    before = [router.workers()[u]["dispatched"] for u in pair]
    docs = ["item 3 is a tool", "the weather today", "a document about item 5"]
    query = "which tool is item 3? " * 20  # a long shared prefix, as a RAG query's
    scores = []
    for _ in range(4):
        r = rclient.post("/v1/rerank", json={"model": model, "query": query, "documents": docs})
        assert r.status_code == 200, r.text
        by_index = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        scores.append([by_index[i] for i in range(len(docs))])
    after = [router.workers()[u]["dispatched"] for u in pair]
    assert sorted(a - b for a, b in zip(after, before, strict=True)) == [0, 4]
    for s in scores:
        assert s == pytest.approx(scores[0], abs=1e-5)
    alone = httpx.post(rerank_server.url + "/v1/rerank", json={"query": query, "documents": docs})
    by_index = {x["index"]: x["relevance_score"] for x in alone.json()["results"]}
    assert [by_index[i] for i in range(len(docs))] == pytest.approx(scores[0], abs=1e-5)


def test_refusals_name_the_cause(rclient, generation_server, embedding_server):
    gen, emb = model_of(generation_server), model_of(embedding_server)
    r = rclient.post("/v1/chat/completions", json={"model": emb, "messages": CHAT})
    assert r.status_code == 400 and "embedding routes" in r.json()["error"]["message"]
    r = rclient.post("/v1/embeddings", json={"model": gen, "input": "x"})
    assert r.status_code == 400 and "generation routes" in r.json()["error"]["message"]
    # two embedding-kind models serve /v1/embeddings here: an unknown or missing name is refused
    r = rclient.post("/v1/embeddings", json={"model": "no-such-model", "input": "x"})
    assert r.status_code == 404 and "no-such-model" in r.json()["error"]["message"]
    r = rclient.post("/encode", json={"text": "x"})
    assert r.status_code == 400 and "name one in 'model'" in r.json()["error"]["message"]
    r = rclient.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400
    r = rclient.post("/v1/chat/completions", json={"model": 7, "messages": CHAT})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    # a worker's own refusal comes back as it gave it
    r = rclient.post("/v1/chat/completions", json={"model": gen, "messages": CHAT, "n": 0})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400


def test_client_that_leaves_aborts_on_the_worker(router, generation_server):
    body = {"text": "Tell me a long story.", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}  # fmt: skip

    def generated() -> int:
        info = httpx.get(generation_server.url + "/server_info", timeout=30).json()
        return info["internal_states"][0]["generated_tokens"]

    for stream in (False, True):
        before = generated()
        if stream:  # a few events, then the connection closes
            with (
                httpx.Client(base_url=router.url, timeout=120.0) as client,
                client.stream("POST", "/generate", json={**body, "stream": True}) as r,
            ):
                for n, _ in enumerate(r.iter_lines()):
                    if n == 4:
                        break
        else:  # gives up waiting for the whole answer
            with (
                httpx.Client(base_url=router.url, timeout=1.0) as client,
                pytest.raises(httpx.TimeoutException),
            ):
                client.post("/generate", json=body)
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            info = httpx.get(generation_server.url + "/server_info", timeout=30).json()
            if info["internal_states"][0]["running_requests"] == 0:
                break
            time.sleep(0.2)
        # aborted on the worker: it stopped well before the 2,000 tokens asked for
        assert generated() - before < 2000
        assert router.workers()[generation_server.url]["load"] == 0


def test_dead_worker_and_api_key(cross_encoder_folder, generation_server):
    flags = ("--model-path", str(cross_encoder_folder), "--served-model-name", "doomed")
    doomed = ServerProcess(*flags, *server_flags())
    doomed.wait_healthy()
    urls = [generation_server.url, doomed.url]
    proc = ModelRouter(urls, "--health-check-interval-secs", "1", api_key="k3y")
    try:
        proc.wait_workers(2)
        auth = {"Authorization": "Bearer k3y"}
        body = {"model": "doomed", "query": "q", "documents": ["a", "b"]}
        assert httpx.post(proc.url + "/v1/rerank", json=body).status_code == 401
        assert httpx.get(proc.url + "/workers").status_code == 401
        assert httpx.get(proc.url + "/health").status_code == 200  # probes need no key
        assert httpx.post(proc.url + "/v1/rerank", json=body, headers=auth).status_code == 200
        doomed.stop(signal.SIGKILL)
        r = httpx.post(proc.url + "/v1/rerank", json=body, headers=auth, timeout=30)
        assert r.status_code == 503 and "doomed" in r.json()["error"]["message"]
        proc.wait_workers(1)  # the health loop agrees
        assert not proc.workers()[doomed.url]["is_healthy"]
        chat = {"messages": CHAT, "max_tokens": 2}  # the other model is still served
        r = httpx.post(proc.url + "/v1/chat/completions", json=chat, headers=auth, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        proc.stop()
        doomed.stop()
