"""POST /v1/embeddings (API process): OpenAI's embeddings endpoint on an embedding server.

Vectors as float lists or, with `encoding_format: base64`, as base64 of little-endian float32
(what the official client decodes); `usage` counts the input tokens.
"""

from __future__ import annotations

import array
import base64
import sys

from fastapi import Request
from fastapi.responses import Response

from radixgen.errors import InvalidRequestError, RadixGenError
from radixgen.json_types import JSONObject
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.embedding_request import embed_request
from radixgen.runtime.entrypoints.openai.protocol import EmbeddingRequest, parse_request
from radixgen.runtime.entrypoints.openai.serving_common import Answer, ServingState, openai_error
from radixgen.runtime.request_side.embedding_requests import EmbeddingResult


def encode_base64(vector: list[float]) -> str:
    """base64 of the vector as little-endian float32."""
    packed = array.array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


async def create_embedding(request: Request) -> Response:
    state = request.app.state.server
    try:
        tm = state.manager()
        req = await hu.read_parsed(request, lambda body: parse_request(EmbeddingRequest, body))
        results, _ = await hu.until_disconnect(
            request, embed_request(tm, req.input, req.dimensions, "input", req.truncate)
        )
    except hu.ClientDisconnected:
        return Response(status_code=499)
    except InvalidRequestError as e:
        return hu.error_response(openai_error(e, "input"))
    except RadixGenError as e:
        return hu.error_response(e)
    return hu.json_response(_response(req, results, tm.served_model_name))


async def run_embedding(state: ServingState, body: JSONObject) -> Answer:
    """One request without HTTP (a batch line): (status code, the route's answer body)."""
    try:
        tm = state.manager()
        req = parse_request(EmbeddingRequest, body)
        results, _ = await embed_request(tm, req.input, req.dimensions, "input", req.truncate)
        return 200, _response(req, results, tm.served_model_name)
    except InvalidRequestError as e:
        failure = hu.error_body(openai_error(e, "input"))
    except RadixGenError as e:
        failure = hu.error_body(e)
    return failure["error"]["code"], failure


def _response(
    req: EmbeddingRequest, results: list[EmbeddingResult], model: str
) -> dict[str, object]:
    as_base64 = req.encoding_format == "base64"
    data: list[dict[str, object]] = [
        {
            "object": "embedding",
            "index": i,
            "embedding": encode_base64(r.embedding) if as_base64 else r.embedding,
        }
        for i, r in enumerate(results)
    ]
    tokens = sum(r.prompt_tokens for r in results)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
