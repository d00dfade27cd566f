"""The /v1 routes of the OpenAI-compatible API: completions, chat, embeddings, rerank, models (tokenize /
detokenize live with the native API)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixgen.errors import RadixGenError
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.openai.files_batches import router as files_batches_router
from radixgen.runtime.entrypoints.openai.serving_chat import create_chat_completion
from radixgen.runtime.entrypoints.openai.serving_completions import create_completion
from radixgen.runtime.entrypoints.openai.serving_embedding import create_embedding
from radixgen.runtime.entrypoints.openai.serving_rerank import create_rerank
from radixgen.runtime.entrypoints.openai.serving_responses import (
    create_response,
    delete_response,
    list_input_items,
    retrieve_response,
)

router = APIRouter()
router.include_router(files_batches_router)
router.add_api_route("/v1/completions", create_completion, methods=["POST"])
router.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"])
router.add_api_route("/v1/responses", create_response, methods=["POST"])
router.add_api_route("/v1/responses/{response_id}", retrieve_response, methods=["GET"])
router.add_api_route("/v1/responses/{response_id}", delete_response, methods=["DELETE"])
router.add_api_route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"])
router.add_api_route("/v1/embeddings", create_embedding, methods=["POST"])
router.add_api_route("/v1/rerank", create_rerank, methods=["POST"])
# SageMaker's name for chat completions, which SGLang serves too
router.add_api_route("/invocations", create_chat_completion, methods=["POST"])


def _model_card(request: Request) -> dict[str, object]:
    state = request.app.state.server
    tm = state.manager()
    return {
        "id": tm.served_model_name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "radixgen",
        "root": tm.served_model_name,
        "max_model_len": tm.context_length,
    }


def _adapter_cards(request: Request, base: dict[str, object]) -> list[dict[str, object]]:
    """A card per loaded LoRA adapter (vLLM's shape: its `root` is the adapter's path, its
    `parent` the base model); a request's `model` may name one."""
    tm = request.app.state.server.manager()
    return [
        {**base, "id": name, "root": path, "parent": base["id"]}
        for name, path in sorted(tm.lora_paths.items())
    ]


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    try:
        card = _model_card(request)
        cards = [card, *_adapter_cards(request, card)]
        return hu.json_response({"object": "list", "data": cards})
    except RadixGenError as e:
        return hu.error_response(e)


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> Response:
    try:
        card = _model_card(request)
        adapters = {c["id"]: c for c in _adapter_cards(request, card)}
    except RadixGenError as e:
        return hu.error_response(e)
    if model in adapters:
        return hu.json_response(adapters[model])
    if model != card["id"]:
        body = {
            "error": {
                "message": f"model '{model}' does not exist; this server serves '{card['id']}'",
                "type": "not_found_error",
                "param": "model",
                "code": 404,
            }
        }
        return hu.json_response(body, 404)
    return hu.json_response(card)
