"""A decoder served with --is-embedding (the default SmolLM2 folder, float32): /v1/embeddings
gives transformers' last hidden state of the last token, L2-normalised."""

from __future__ import annotations

import httpx
import numpy as np
import torch

TEXTS = ["The capital of France is Paris.", "def add(a, b): return a + b", "Hi"]


def test_last_token_states_match_transformers(decoder_embedding_server, default_model_folder):
    import transformers

    with httpx.Client(base_url=decoder_embedding_server.url, timeout=120.0) as client:
        r = client.post("/v1/embeddings", json={"input": TEXTS})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]])
        # asked again, a text reuses all but its last token from the radix tree (meta_info)
        again = client.post("/encode", json={"text": TEXTS[0]}).json()["meta_info"]
        assert again["cached_tokens"] == again["prompt_tokens"] - 1, again
        gen = client.post("/generate", json={"text": "Hi"})
        assert gen.status_code == 400 and "embedding model" in gen.json()["error"]["message"]
    tok = transformers.AutoTokenizer.from_pretrained(default_model_folder)
    model = transformers.AutoModel.from_pretrained(default_model_folder, dtype=torch.float32)
    for i, text in enumerate(TEXTS):
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            last = model(input_ids=ids).last_hidden_state[0, -1].double().numpy()
        want = last / np.linalg.norm(last)
        cos = float(got[i] @ want / np.linalg.norm(got[i]))
        assert cos >= 0.9999, (text, cos)
