"""The inputs of an embedding request, shared by /v1/embeddings and /encode (API process):
text or token ids, one or a batch, tokenized off the event loop and embedded by the
TokenizerManager."""

from __future__ import annotations

import uuid
from typing import TypedDict

from radixgen.errors import InvalidRequestError
from radixgen.runtime.request_side.embedding_requests import EmbeddingResult
from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def split_inputs(
    value: object, param: str
) -> tuple[list[str] | None, list[list[int]] | None, bool]:
    """(texts, token lists, whether a batch) of a string, a list of strings, a token list or a
    list of token lists; anything else is a 400 naming `param`."""
    if isinstance(value, str):
        return [value], None, False
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value), None, True
        if _is_ids(value):
            return None, [list(value)], False
        if all(_is_ids(v) for v in value):
            return None, [list(v) for v in value], True
    raise InvalidRequestError(
        f"{param} must be a string, a list of strings, a list of token ids or a list of such "
        "lists (non-empty)",
        param,
    )


class EncodeMetaInfo(TypedDict):
    id: str
    prompt_tokens: int
    cached_tokens: int  # of the prompt, reused from a decoder embedder's radix tree


class EncodeOutput(TypedDict):
    """One input's answer to SGLang's encode (`Engine.encode`, POST /encode)."""

    embedding: list[float]
    meta_info: EncodeMetaInfo


def encode_outputs(
    results: list[EmbeddingResult], batch: bool
) -> EncodeOutput | list[EncodeOutput]:
    """SGLang's encode answer: `{"embedding", "meta_info"}` per input, a list for a batch."""
    outs: list[EncodeOutput] = [
        {
            "embedding": r.embedding,
            "meta_info": {
                "id": uuid.uuid4().hex,
                "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
            },
        }
        for r in results
    ]
    return outs if batch else outs[0]


async def embed_request(
    tm: TokenizerManager, value: object, dimensions: object, param: str, truncate: object = False
) -> tuple[list[EmbeddingResult], bool]:
    """The vectors of the request's inputs, in order, and whether it was a batch; truncate: an
    input over the model's limit is cut to it (text: as sentence-transformers cuts, the closing
    special token kept; token ids: the first ones kept) instead of refused."""
    texts, ids, batch = split_inputs(value, param)
    if texts is not None and not all(texts):  # as OpenAI: an empty text is no input
        i = texts.index("")
        raise InvalidRequestError(f"{param}[{i}] is empty" if batch else f"{param} is empty", param)
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool)):
        raise InvalidRequestError("dimensions must be an integer", "dimensions")
    if not isinstance(truncate, bool):
        raise InvalidRequestError("truncate must be a boolean", "truncate")
    if texts is not None:
        tm.limits.check_sequences(len(texts))  # before tokenizing a huge batch
        limit = tm.max_embedding_tokens if truncate else None
        ids = await tm.encode_texts(texts, True, param, limit)
    elif truncate:
        ids = [seq[: tm.max_embedding_tokens] for seq in ids or []]
    assert ids is not None
    return await tm.embed(ids, dimensions, param), batch
