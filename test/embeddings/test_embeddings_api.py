"""The embedding routes on a real `--is-embedding` server (the bundled all-MiniLM-L6-v2):
OpenAI's /v1/embeddings through the official client, SGLang's /encode, and the refusals.

Every vector is checked against sentence-transformers on the same model folder.
"""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

COSINE_MIN = 0.9999
TEXTS = [
    "A man is eating food.",
    "The new movie is awesome, I loved it!",
    "Quantum entanglement links particles regardless of distance.",
    "東京は日本の首都です。",
]


def _cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _want(reference, texts, dims: int | None = None):
    vecs = reference.encode(texts, convert_to_numpy=True)
    if dims is not None:
        vecs = vecs[:, :dims]
        vecs = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs


def test_one_string(oai, reference):
    resp = oai.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS[0])
    assert len(resp.data) == 1 and resp.data[0].index == 0
    vec = resp.data[0].embedding
    assert len(vec) == 384
    assert _cosine(vec, _want(reference, [TEXTS[0]])[0]) >= COSINE_MIN
    n_tokens = len(reference.tokenizer(TEXTS[0])["input_ids"])
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == n_tokens


def test_list_of_strings_in_order(oai, reference):
    resp = oai.embeddings.create(model="m", input=TEXTS)
    want = _want(reference, TEXTS)
    assert [d.index for d in resp.data] == list(range(len(TEXTS)))
    for d, w in zip(resp.data, want, strict=True):
        assert _cosine(d.embedding, w) >= COSINE_MIN
    # the batch's vectors are the ones each text gets alone
    alone = oai.embeddings.create(model="m", input=TEXTS[2]).data[0].embedding
    np.testing.assert_allclose(alone, resp.data[2].embedding, atol=1e-6)


def test_token_ids(oai, reference):
    ids = [reference.tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    single = oai.embeddings.create(model="m", input=ids[0])
    assert _cosine(single.data[0].embedding, _want(reference, TEXTS[:1])[0]) >= COSINE_MIN
    batch = oai.embeddings.create(model="m", input=ids)
    for d, w in zip(batch.data, _want(reference, TEXTS[:2]), strict=True):
        assert _cosine(d.embedding, w) >= COSINE_MIN


def test_dimensions_and_base64(oai, http, reference):
    resp = oai.embeddings.create(model="m", input=TEXTS[:2], dimensions=64)
    for d, w in zip(resp.data, _want(reference, TEXTS[:2], 64), strict=True):
        assert len(d.embedding) == 64
        assert abs(np.linalg.norm(d.embedding) - 1.0) < 1e-5
        assert _cosine(d.embedding, w) >= COSINE_MIN
    raw = http.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert vec.shape == (384,)
    assert _cosine(vec, _want(reference, TEXTS[:1])[0]) >= COSINE_MIN
    # asked for explicitly, the client hands the base64 string back as it came
    via_sdk = oai.embeddings.create(model="m", input=TEXTS[0], encoding_format="base64")
    assert via_sdk.data[0].embedding == raw["data"][0]["embedding"]
    # left to itself (numpy present), it asks for base64 and decodes: the floats come back
    default = oai.embeddings.create(model="m", input=TEXTS[0]).data[0].embedding
    np.testing.assert_array_equal(np.asarray(default, dtype="<f4"), vec)


def test_encode_route(http, reference):
    one = http.post("/encode", json={"text": TEXTS[0]})
    assert one.status_code == 200, one.text
    body = one.json()
    assert _cosine(body["embedding"], _want(reference, TEXTS[:1])[0]) >= COSINE_MIN
    assert body["meta_info"]["prompt_tokens"] > 0
    assert body["meta_info"]["cached_tokens"] == 0  # an encoder reuses nothing
    batch = http.post("/encode", json={"text": TEXTS[:2]}).json()
    assert isinstance(batch, list) and len(batch) == 2
    ids = reference.tokenizer(TEXTS[1])["input_ids"]
    by_ids = http.post("/encode", json={"input_ids": ids}).json()
    np.testing.assert_allclose(by_ids["embedding"], batch[1]["embedding"], atol=1e-6)


def test_too_long_input_is_a_400_naming_the_limit(oai):
    with pytest.raises(openai.BadRequestError) as err:
        oai.embeddings.create(model="m", input="word " * 400)
    assert "at most 256" in str(err.value)


def test_truncate_cuts_to_the_limit_as_sentence_transformers_does(oai, http, reference):
    long_text = "the quick brown fox jumps over the lazy dog " * 60  # ~540 tokens
    resp = oai.embeddings.create(model="m", input=long_text, extra_body={"truncate": True})
    assert resp.usage.prompt_tokens == 256
    assert _cosine(resp.data[0].embedding, _want(reference, [long_text])[0]) >= COSINE_MIN
    ids = reference.tokenizer(long_text)["input_ids"]
    by_ids = http.post("/encode", json={"input_ids": ids, "truncate": True})
    assert by_ids.status_code == 200, by_ids.text
    assert by_ids.json()["meta_info"]["prompt_tokens"] == 256


@pytest.mark.parametrize(
    "body, says",
    [
        ({"input": ""}, "empty"),
        ({"input": []}, "input"),
        ({"input": [[]]}, "empty"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [99999999]}, "vocabulary"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": 385}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "temperature": 1}, "unknown field"),
    ],
)
def test_bad_inputs_are_400s(http, body, says):
    r = http.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_generation_is_refused_with_a_400(http, oai):
    for path, body in [
        ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}),
        ("/v1/completions", {"model": "m", "prompt": "Hi"}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
    ]:
        r = http.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        assert "embedding model" in r.json()["error"]["message"], path
    assert http.get("/health_generate").status_code == 200
    info = http.get("/model_info").json()
    assert info["is_generation"] is False


def test_a_batch_of_embedding_lines(oai):
    """The Batch API on an embedding server: /v1/embeddings lines, answered as the route does."""
    import json
    import time

    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "m", "input": [f"text {i}", f"another {i}"], "dimensions": 64}}
             for i in range(3)]  # fmt: skip
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    file = oai.files.create(file=("emb.jsonl", data), purpose="batch")
    batch = oai.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                               completion_window="24h")  # fmt: skip
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
        batch = oai.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 3
    out = [json.loads(x) for x in oai.files.content(batch.output_file_id).text.splitlines()]
    for record in out:
        body = record["response"]["body"]
        assert [len(d["embedding"]) for d in body["data"]] == [64, 64]
        assert body["usage"]["prompt_tokens"] > 0


def test_dashboard_shows_an_embedding_servers_counters(http, oai):
    """An embedding server's dashboard: its counters, and no tree, steps or timelines."""
    oai.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS[:2])
    r = http.get("/dashboard/api/snapshot")
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["state"]["embedded_requests"] >= 1
    assert view["state"]["embedding_dim"] == 384
    assert view["radix_enabled"] is False and view["tree"] == {"nodes": [], "truncated": False}
    assert view["steps"] == [] and view["batch"] is None and view["requests"] == []
    assert view["dp_size"] == 1
    assert view["history"][-1]["waiting"] == 0
