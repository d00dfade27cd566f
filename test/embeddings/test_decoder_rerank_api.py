"""A decoder served as a yes/no reranker (--reranker-tokens yes,no; the default SmolLM2 folder
in float32, with the default Qwen3-Reranker prompt): /v1/rerank's scores are transformers'
p(yes) / (p(yes) + p(no)) at the answer position, and ordered as they are, with the shared
template and query reused from the radix tree."""

from __future__ import annotations

import httpx
import torch

from radixgen.runtime.text.rerank_prompt import DEFAULT_RERANK_TEMPLATE, rerank_prompt

from .conftest import RERANK_CONTEXT

SETS = [
    ("What is the capital of France?", ["Paris is the capital of France.", "Bananas are yellow."]),
    ("How do plants make food?", ["By photosynthesis.", "Cars need fuel.", "Plants use light."]),
    ("Who wrote Hamlet?", ["Shakespeare wrote Hamlet.", "Hamlet is a small village."]),
]


def test_scores_match_transformers(decoder_rerank_server, default_model_folder):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(default_model_folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        default_model_folder, dtype=torch.float32
    ).eval()
    yes, no = (tok(t, add_special_tokens=False)["input_ids"][0] for t in ("yes", "no"))
    with httpx.Client(base_url=decoder_rerank_server.url, timeout=120.0) as client:
        for query, docs in SETS:
            r = client.post("/v1/rerank", json={"query": query, "documents": docs})
            assert r.status_code == 200, r.text
            results = r.json()["results"]
            got = {item["index"]: item["relevance_score"] for item in results}
            want = []
            for doc in docs:
                prompt = rerank_prompt(DEFAULT_RERANK_TEMPLATE, query, doc)
                ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
                with torch.no_grad():
                    logits = model(input_ids=ids).logits[0, -1]
                want.append(torch.softmax(logits[[yes, no]], dim=-1)[0].item())
            for i, w in enumerate(want):
                assert abs(got[i] - w) < 1e-4, (query, i, got[i], w)
            assert [item["index"] for item in results] == sorted(
                range(len(docs)), key=lambda i: -want[i]
            )
        # each set's later documents reused the template and query from the radix tree
        state = client.get("/server_info").json()["internal_states"][0]
        assert state["cached_tokens"] > 0, state
        flushed = client.post("/flush_cache")
        assert flushed.status_code == 200 and "Cache flushed" in flushed.text, flushed.text
        emb = client.post("/v1/embeddings", json={"input": "hello"})
        assert emb.status_code == 400 and "/v1/rerank" in emb.json()["error"]["message"]


def _p_yes(model, tok, prompt: str, yes: int, no: int) -> float:
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    return torch.softmax(logits[[yes, no]], dim=-1)[0].item()


def test_truncate_cuts_the_document_to_fit_the_limit(decoder_rerank_server, default_model_folder):
    """`truncate` on a yes/no reranker cuts the document (never the instruction, the query or
    the answer turn) to its longest token prefix whose prompt fits the model's limit; without
    it the pair is a 400 naming the limit, and a query too long to fit even so is a 400 too."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(default_model_folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        default_model_folder, dtype=torch.float32
    ).eval()
    yes, no = (tok(t, add_special_tokens=False)["input_ids"][0] for t in ("yes", "no"))
    query = "When was the Eiffel Tower built?"
    long_doc = " ".join(f"Paris fact {i}: the Eiffel Tower was built in 1889." for i in range(40))
    short_doc = "The Eiffel Tower was finished in 1889."

    def fits(k: int, doc_ids: list[int]) -> str | None:
        doc = tok.decode(doc_ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        prompt = rerank_prompt(DEFAULT_RERANK_TEMPLATE, query, doc)
        n = len(tok(prompt, add_special_tokens=False)["input_ids"])
        return prompt if n <= RERANK_CONTEXT else None

    doc_ids = tok(long_doc, add_special_tokens=False)["input_ids"]
    assert fits(len(doc_ids), doc_ids) is None  # the whole pair is over the limit
    k = next(k for k in range(len(doc_ids), -1, -1) if fits(k, doc_ids))
    want_long = _p_yes(model, tok, fits(k, doc_ids), yes, no)
    want_short = _p_yes(
        model, tok, rerank_prompt(DEFAULT_RERANK_TEMPLATE, query, short_doc), yes, no
    )
    with httpx.Client(base_url=decoder_rerank_server.url, timeout=120.0) as client:
        refused = client.post("/v1/rerank", json={"query": query, "documents": [long_doc]})
        assert refused.status_code == 400, refused.text
        assert f"at most {RERANK_CONTEXT}" in refused.json()["error"]["message"]
        body = {"query": query, "documents": [long_doc, short_doc], "truncate": True}
        r = client.post("/v1/rerank", json=body)
        assert r.status_code == 200, r.text
        got = {item["index"]: item["relevance_score"] for item in r.json()["results"]}
        assert abs(got[0] - want_long) < 1e-4 and abs(got[1] - want_short) < 1e-4, got
        huge = client.post(
            "/v1/rerank", json={"query": query * 40, "documents": ["d"], "truncate": True}
        )
        assert huge.status_code == 400 and "query" in huge.json()["error"]["message"], huge.text
