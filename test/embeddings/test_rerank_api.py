"""/v1/rerank on a real server of a cross-encoder (a tiny random BertForSequenceClassification:
its config alone makes the server an embedding server): scores and their order match
transformers' on 20 query/document sets; top_n, return_documents and the refusals."""

from __future__ import annotations

import httpx
import pytest
import torch

SETS = [
    (
        f"query {i}: what is item {i * 7 % 13}?",
        [
            f"item {i * 7 % 13} is a tool for task {i}",
            "an unrelated sentence about the weather",
            f"document of set {i} mentions item {2 * i + 1}",
            "short",
        ][: 2 + i % 3],
    )
    for i in range(20)
]


@pytest.fixture(scope="module")
def hf_scores(cross_encoder_folder):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(cross_encoder_folder))
    model = transformers.BertForSequenceClassification.from_pretrained(
        str(cross_encoder_folder)
    ).eval()

    def score(query: str, docs: list[str]) -> list[float]:
        enc = tok(
            [query] * len(docs),
            docs,
            padding=True,
            truncation=True,
            max_length=512,
            return_tensors="pt",
        )
        with torch.no_grad():
            return torch.sigmoid(model(**enc).logits[:, 0]).tolist()

    return score


@pytest.fixture(scope="module")
def rerank_http(rerank_server):
    with httpx.Client(base_url=rerank_server.url, timeout=120.0) as client:
        yield client


def test_scores_and_order_match_transformers(rerank_http, hf_scores):
    for query, docs in SETS:
        r = rerank_http.post("/v1/rerank", json={"query": query, "documents": docs})
        assert r.status_code == 200, r.text
        body = r.json()
        want = hf_scores(query, docs)
        got = {item["index"]: item["relevance_score"] for item in body["results"]}
        assert sorted(got) == list(range(len(docs)))
        for i, w in enumerate(want):
            assert abs(got[i] - w) < 1e-5, (query, i, got[i], w)
        hf_order = sorted(range(len(docs)), key=lambda i: -want[i])
        assert [item["index"] for item in body["results"]] == hf_order
        assert all(item["document"]["text"] == docs[item["index"]] for item in body["results"])
        assert body["usage"]["total_tokens"] > 0


def test_truncate_cuts_a_long_pair_to_the_limit(rerank_http, hf_scores):
    query, docs = "what is a fox?", ["a fox " * 600, "a dog"]
    r = rerank_http.post("/v1/rerank", json={"query": query, "documents": docs, "truncate": True})
    assert r.status_code == 200, r.text
    got = {item["index"]: item["relevance_score"] for item in r.json()["results"]}
    for i, w in enumerate(hf_scores(query, docs)):
        assert abs(got[i] - w) < 1e-5


def test_top_n_and_return_documents(rerank_http):
    query, docs = SETS[2]
    full = rerank_http.post("/v1/rerank", json={"query": query, "documents": docs}).json()
    top = rerank_http.post(
        "/v1/rerank",
        json={"query": query, "documents": docs, "top_n": 2, "return_documents": False},
    ).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in full["results"][:2]]
    assert all("document" not in r for r in top["results"])


@pytest.mark.parametrize(
    "body, says",
    [
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["a", ""]}, "documents[1] is empty"),
        ({"query": "", "documents": ["a"]}, "query is empty"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": "q", "documents": ["word " * 600]}, "at most 512"),
    ],
)
def test_bad_rerank_requests_are_400s(rerank_http, body, says):
    r = rerank_http.post("/v1/rerank", json=body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_a_reranker_makes_no_embeddings(rerank_http):
    r = rerank_http.post("/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 400
    assert "cross-encoder" in r.json()["error"]["message"]


def test_an_embedding_model_does_not_rerank(http):
    r = http.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 400
    assert "cross-encoder" in r.json()["error"]["message"]
