"""A decoder served as a yes/no reranker (--reranker-tokens yes,no; the default SmolLM2 folder
in float32, with the default Qwen3-Reranker prompt): /v1/rerank's scores are transformers'
p(yes) / (p(yes) + p(no)) at the answer position, and ordered as they are, with the shared
template and query reused from the radix tree."""

from __future__ import annotations

import httpx
import torch

from radixgen.runtime.text.rerank_prompt import DEFAULT_RERANK_TEMPLATE, rerank_prompt

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
        cut = client.post("/v1/rerank", json={"query": "q", "documents": ["d"], "truncate": True})
        assert cut.status_code == 400
