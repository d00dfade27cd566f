"""POST /v1/rerank (API process): a cross-encoder scores each document against the query.

The shape SGLang, Jina and Cohere share: `results` sorted by `relevance_score` (best first; a
tie keeps the documents' order), cut to `top_n`, each with the document's `index` and, unless
`return_documents` is false, its text.
"""

from __future__ import annotations

import uuid

from fastapi import Request
from fastapi.responses import Response

from radixgen.errors import InvalidRequestError, RadixGenError
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.openai.protocol import RerankRequest, parse_request


async def create_rerank(request: Request) -> Response:
    state = request.app.state.server
    try:
        tm = state.manager()
        req = await hu.read_parsed(request, lambda body: parse_request(RerankRequest, body))
        if not req.query:
            raise InvalidRequestError("query is empty", "query")
        if not all(req.documents):
            raise InvalidRequestError(f"documents[{req.documents.index('')}] is empty", "documents")
        results = await hu.until_disconnect(
            request, tm.rerank(req.query, req.documents, req.truncate)
        )
    except hu.ClientDisconnected:
        return Response(status_code=499)
    except RadixGenError as e:
        return hu.error_response(e)
    order = sorted(range(len(results)), key=lambda i: -results[i].embedding[0])
    if req.top_n is not None:
        order = order[: req.top_n]
    ranked = []
    for i in order:
        item: dict[str, object] = {"index": i, "relevance_score": results[i].embedding[0]}
        if req.return_documents:
            item["document"] = {"text": req.documents[i]}
        ranked.append(item)
    tokens = sum(r.prompt_tokens for r in results)
    return hu.json_response(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": tm.served_model_name,
            "results": ranked,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
