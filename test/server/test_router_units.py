"""The model router's choice of worker (`runtime/router/worker_registry.py`), without processes:
which workers may take a route and a `model`, the refusals and their status codes, the routing
key, and the load and dispatch counts the policy reads."""

from __future__ import annotations

import pytest

from radixgen.errors import InvalidRequestError
from radixgen.runtime.router.worker_registry import (
    ModelNotFoundError,
    NoWorkerError,
    RouteKind,
    Worker,
    WorkerRegistry,
    routing_key,
)

GEN, EMB = RouteKind.GENERATION, RouteKind.EMBEDDING


def registry(*workers: tuple[str, str, bool | None, bool], policy: str = "cache_aware"):
    reg = WorkerRegistry([w[0] for w in workers], policy)
    for worker, (_, model, is_generation, healthy) in zip(reg.workers, workers, strict=True):
        worker.model_ids = (model, f"{model}-lora") if model else ()
        worker.is_generation = is_generation
        worker.healthy = healthy
    return reg


def urls(workers: list[Worker]) -> list[str]:
    return [w.url for w in workers]


def test_a_named_model_goes_to_its_workers_of_the_route_kind():
    reg = registry(("http://g1", "chat", True, True), ("http://g2", "chat", True, True),
                   ("http://e", "emb", False, True))  # fmt: skip
    assert urls(reg.candidates(GEN, "chat", "/v1/chat/completions")) == ["http://g1", "http://g2"]
    assert urls(reg.candidates(EMB, "emb", "/v1/embeddings")) == ["http://e"]
    # a LoRA adapter a worker lists is its model too
    assert urls(reg.candidates(GEN, "chat-lora", "/generate")) == ["http://g1", "http://g2"]
    # no name, or an unknown one: the route's only model takes it (a server ignores the name)
    assert urls(reg.candidates(EMB, None, "/encode")) == ["http://e"]
    assert urls(reg.candidates(GEN, "gpt-4o", "/v1/chat/completions")) == ["http://g1", "http://g2"]


def test_refusals():
    reg = registry(("http://g", "chat", True, True), ("http://e1", "emb", False, True),
                   ("http://e2", "rerank", False, False))  # fmt: skip
    with pytest.raises(InvalidRequestError, match="served for embedding routes, not /generate"):
        reg.candidates(GEN, "emb", "/generate")
    with pytest.raises(InvalidRequestError, match="served for generation routes"):
        reg.candidates(EMB, "chat", "/v1/embeddings")
    with pytest.raises(NoWorkerError, match="'rerank'") as down:
        reg.candidates(EMB, "rerank", "/v1/rerank")
    assert down.value.status_code == 503
    reg.workers[2].healthy = True  # two embedding-kind models now: a name is needed
    with pytest.raises(InvalidRequestError, match="name one in 'model'"):
        reg.candidates(EMB, None, "/v1/embeddings")
    with pytest.raises(ModelNotFoundError, match="'nope' does not exist") as missing:
        reg.candidates(EMB, "nope", "/v1/embeddings")
    assert missing.value.status_code == 404
    gen_only = registry(("http://g", "chat", True, True))
    with pytest.raises(ModelNotFoundError, match="no worker behind this router serves /encode"):
        gen_only.candidates(EMB, None, "/encode")
    gen_only.mark_down(gen_only.workers[0], "ConnectError")
    with pytest.raises(NoWorkerError):
        gen_only.candidates(GEN, None, "/generate")


def test_workers_not_yet_answered_and_known_models_that_are_down():
    # a worker still loading has no models yet: a name nobody lists may be its own
    reg = registry(("http://a", "chat-a", True, True), ("http://b", "", None, False))
    with pytest.raises(NoWorkerError, match="1 worker\\(s\\) have not answered"):
        reg.candidates(GEN, "chat-b", "/v1/chat/completions")
    assert urls(reg.candidates(GEN, None, "/generate")) == ["http://a"]  # no name: those known
    # a second generation model that is down still counts: a request must name one
    reg = registry(("http://a", "chat-a", True, True), ("http://b", "chat-b", True, False))
    with pytest.raises(InvalidRequestError, match="name one in 'model'"):
        reg.candidates(GEN, None, "/generate")
    with pytest.raises(NoWorkerError, match="'chat-b'"):
        reg.candidates(GEN, "chat-b", "/generate")


def test_a_worker_of_unknown_kind_serves_every_route():
    reg = registry(("http://other", "m", None, True))
    assert urls(reg.candidates(GEN, "m", "/v1/completions")) == ["http://other"]
    assert urls(reg.candidates(EMB, "m", "/v1/embeddings")) == ["http://other"]
    assert reg.workers[0].as_dict()["kind"] == "any"


def test_cache_aware_choice_and_counts():
    reg = registry(("http://a", "chat", True, True), ("http://b", "chat", True, True))
    cands = reg.candidates(GEN, "chat", "/generate")
    system = "You extract invoices. " * 20
    first = reg.choose(cands, routing_key({"messages": [{"role": "system", "content": system}]}))
    other = reg.choose(cands, routing_key({"prompt": "an unrelated prompt " * 20}))
    assert first is not other  # nothing shared: the less loaded worker
    for n in range(3):
        body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": str(n)}]}  # fmt: skip
        assert reg.choose(cands, routing_key(body)) is first
    assert (first.dispatched, other.dispatched) == (4, 1)
    assert (first.load, other.load) == (4, 1)  # released by the app when each answer ends


def test_round_robin_alternates_and_unknown_policy_is_refused():
    reg = registry(("http://a", "m", True, True), ("http://b", "m", True, True), policy="round_robin")  # fmt: skip
    cands = reg.candidates(GEN, "m", "/generate")
    picks = [reg.choose(cands, b"same prefix").url for _ in range(4)]
    assert picks == ["http://a", "http://b", "http://a", "http://b"]
    with pytest.raises(ValueError, match="unknown load balance method"):
        WorkerRegistry(["http://a"], "random-ish")
    with pytest.raises(InvalidRequestError, match="at least one worker"):
        WorkerRegistry([], "round_robin")


def test_routing_key_puts_the_shared_parts_first_and_is_bounded():
    chat = routing_key({"model": "m", "messages": [{"role": "system", "content": "S"}]})
    longer = routing_key({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]})  # fmt: skip
    assert longer.startswith(chat[:-1])  # a later turn extends the earlier key
    rerank = routing_key({"query": "q", "documents": ["d1", "d2"]})
    assert rerank.startswith(b"q\n")
    assert len(routing_key({"prompt": "x" * 10_000})) == 4096
    assert routing_key({"input_ids": [1, 2, 3]}) == b"[1,2,3]"
