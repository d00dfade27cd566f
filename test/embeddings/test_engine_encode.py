"""`Engine(is_embedding=True).encode`: SGLang's offline embedding call, the same vectors as the
server's and sentence-transformers'."""

from __future__ import annotations

import numpy as np
import pytest

from radixgen.errors import InvalidRequestError


def test_encode_matches_sentence_transformers(embedding_engine, reference):
    texts = ["A man is eating food.", "The girl is carrying a baby."]
    one = embedding_engine.encode(texts[0])
    assert set(one) == {"embedding", "meta_info"} and len(one["embedding"]) == 384
    batch = embedding_engine.encode(texts, dimensions=32)
    want = reference.encode(texts, convert_to_numpy=True)
    got = np.array(one["embedding"])
    assert got @ want[0] / np.linalg.norm(got) / np.linalg.norm(want[0]) >= 0.9999
    short = want[:, :32] / np.linalg.norm(want[:, :32], axis=1, keepdims=True)
    for item, w in zip(batch, short, strict=True):
        assert float(np.dot(item["embedding"], w)) >= 0.9999
    with pytest.raises(InvalidRequestError):
        embedding_engine.encode("word " * 400)
    with pytest.raises(InvalidRequestError):
        embedding_engine.generate("Hi")
