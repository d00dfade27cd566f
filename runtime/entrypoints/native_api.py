"""SGLang's native HTTP API (API process): /generate, /encode, health, info, cache, abort, tokenize.

What `sglang.RuntimeEndpoint` and SGLang's HTTP clients call. Streaming sends SSE chunks with the
cumulative text, delta output logprobs and cumulative token counters, one chunk per output that
adds text (or finishes; never a replayed burst), then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from radixgen.errors import EngineDeadError, InvalidRequestError, RadixGenError
from radixgen.generate_output import GenerateOutput
from radixgen.io_struct import GenerateReqInput
from radixgen.json_types import is_str_list, is_token_ids
from radixgen.runtime.entrypoints.embedding_request import embed_request, encode_outputs
from radixgen.runtime.entrypoints.generate_request import parse_generate_request
from radixgen.runtime.entrypoints.http_utils import (
    SSE_DONE,
    SSE_HEADERS,
    ClientDisconnected,
    collect,
    error_body,
    error_response,
    first_chunk_or_refusal,
    json_response,
    raise_if_failed,
    read_json,
    read_parsed,
    sse_event,
    stream_error,
    stream_failure,
    until_disconnect,
)
from radixgen.runtime.entrypoints.server_state import ServerState
from radixgen.runtime.request_side.hicache_status import hicache_tiers
from radixgen.version import __version__

logger = logging.getLogger(__name__)
router = APIRouter()

HEALTH_GENERATE_TIMEOUT_S = 20.0
SECRET_ARGS = ("api_key", "api_key_file")


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


# --- embeddings ----------------------------------------------------------------------------------


@router.api_route("/encode", methods=["POST", "PUT"])
async def encode(request: Request) -> Response:
    """SGLang's embedding route: `text` or `input_ids` (one or a batch), optional `dimensions`;
    `{"embedding", "meta_info"}` per input (a list for a batch)."""
    try:
        body = await read_json(request)
        tm = server_state(request).manager()
        if not isinstance(body, dict):
            raise InvalidRequestError("the body must be a JSON object", None)
        unknown = sorted(
            set(body) - {"text", "input_ids", "dimensions", "truncate", "rid", "model"}
        )
        if unknown:
            raise InvalidRequestError(f"unknown field {unknown[0]!r}", unknown[0])
        param = "input_ids" if body.get("text") is None else "text"
        if (body.get("text") is None) == (body.get("input_ids") is None):
            raise InvalidRequestError("give exactly one of text and input_ids", param)
        results, batch = await until_disconnect(
            request,
            embed_request(
                tm, body[param], body.get("dimensions"), param, body.get("truncate", False)
            ),
        )
    except ClientDisconnected:
        return Response(status_code=499)
    except RadixGenError as e:
        return error_response(e)
    return json_response(encode_outputs(results, batch))


# --- generation ----------------------------------------------------------------------------------


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request) -> Response:
    try:
        obj = await read_parsed(request, parse_generate_request)
        tm = server_state(request).manager()
        if not obj.stream:
            result = await until_disconnect(request, collect(tm.generate(obj)))
            raise_if_failed(result)
            return json_response(result)
        first, rest = await first_chunk_or_refusal(tm.generate(obj), request)
    except ClientDisconnected:
        return Response(status_code=499)
    except RadixGenError as e:
        return error_response(e)
    return StreamingResponse(_sse(first, rest), media_type="text/event-stream", headers=SSE_HEADERS)


async def _sse(
    first: GenerateOutput | list[GenerateOutput],
    rest: AsyncGenerator[GenerateOutput | list[GenerateOutput], None],
) -> AsyncIterator[bytes]:
    """SSE framing; closing `rest` on a disconnect cancels and aborts the request in the engine."""
    try:
        chunk = first
        while True:
            err = stream_error(chunk)
            if err is not None:
                yield sse_event(err)
                break
            yield sse_event(chunk)
            try:
                chunk = await rest.__anext__()
            except StopAsyncIteration:
                break
    except Exception as e:  # NOTE: a bug too ends the stream with an error event
        failure = stream_failure(e)
        yield sse_event({"error": {**failure["error"], "retryable": False}})
    finally:
        await rest.aclose()
    yield SSE_DONE


# --- health and info -----------------------------------------------------------------------------


@router.get("/health")
async def health(request: Request) -> Response:
    state = server_state(request)
    if state.healthy:
        return Response(status_code=200)
    try:
        state.manager()
        raise EngineDeadError("the engine is not running")
    except RadixGenError as e:
        return error_response(e)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """Healthy only if one token can be generated now (an embedding server: one input embedded)."""
    try:
        tm = server_state(request).manager()
        if tm.embeddings is not None:
            work: Awaitable[object] = tm.warm_up()
        else:
            obj = GenerateReqInput(
                text="Hi",
                sampling_params={"max_new_tokens": 1},
                rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            )
            work = collect(tm.generate(obj))
        await asyncio.wait_for(work, HEALTH_GENERATE_TIMEOUT_S)
    except asyncio.TimeoutError:
        return error_response(EngineDeadError("no token within the health-check timeout"))
    except RadixGenError as e:
        return error_response(e)
    return Response(status_code=200)


@router.get("/ping")
async def ping() -> Response:
    return Response(status_code=200)


@router.api_route("/", methods=["GET", "HEAD"])
async def root() -> Response:
    """SGLang answers its root with a JSON string saying it runs; load balancers probe it."""
    return json_response("RadixGen is running")


@router.get("/ready")
async def ready(request: Request) -> Response:
    return await health(request)


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(request: Request) -> Response:
    try:
        tm = server_state(request).manager()
    except RadixGenError as e:
        return error_response(e)
    info = tm.model_info()
    template = tm.tokenizer.chat_template
    info.update(
        {
            # radixgen.lang reads the role markers off the served template (no shared disk)
            "chat_template": template.source if template is not None else None,
            "eos_token": tm.tokenizer.eos_token,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "preferred_sampling_params": None,
            "model_type": None,
            "architectures": None,
        }
    )
    return json_response(info)


@router.get("/get_server_info")
@router.get("/server_info")
async def server_info(request: Request) -> Response:
    state = server_state(request)
    try:
        tm = state.manager()
        internal = await tm.get_internal_states()  # one per data-parallel replica
    except (RadixGenError, asyncio.TimeoutError) as e:
        return error_response(e if isinstance(e, RadixGenError) else EngineDeadError(str(e)))
    args = {k: v for k, v in state.args.to_flat_dict().items() if k not in SECRET_ARGS}
    return json_response(
        {
            **args,
            **tm.model_info(),
            "version": __version__,
            "startup_time": state.started_at,
            "ready_time": state.ready_at,
            "max_context_length": tm.context_length,
            "max_req_input_len": tm.ready.max_req_input_len,
            "num_threads": tm.ready.num_threads,
            "internal_states": [s.as_dict() for s in internal],
        }
    )


@router.get("/hicache")
async def hicache_status(request: Request) -> Response:
    """HiCache's tiers per replica: capacities, use and hits (device, host, storage)."""
    state = server_state(request)
    try:
        internal = await state.manager().get_internal_states()
    except (RadixGenError, asyncio.TimeoutError) as e:
        return error_response(e if isinstance(e, RadixGenError) else EngineDeadError(str(e)))
    cache = state.args.cache
    return json_response(
        {
            "enabled": cache.enable_hierarchical_cache,
            "storage_backend": cache.hicache_storage_backend,
            "write_policy": cache.hicache_write_policy,
            "replicas": [hicache_tiers(s) for s in internal],
        }
    )


# --- control -------------------------------------------------------------------------------------


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    """Empty the prefix cache: every HiCache tier, or only the KV pool's tree with
    `?pool_only=true` (the host and file tiers then serve the next requests)."""
    pool_only = request.query_params.get("pool_only", "").lower() in ("1", "true", "yes")
    try:
        out = await server_state(request).manager().flush_cache(keep_lower_tiers=pool_only)
    except RadixGenError as e:
        return error_response(e)
    if out.success:
        return PlainTextResponse("Cache flushed.\n", status_code=200)
    return PlainTextResponse(f"Cache not flushed: {out.message}\n", status_code=400)


async def _lora_body(request: Request, keys: tuple[str, ...]) -> list[str]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object", None)
    values = [body.get(k) for k in keys]
    for key, value in zip(keys, values, strict=True):
        if not isinstance(value, str) or not value:
            raise InvalidRequestError(f"{key} must be a non-empty string", key)
    return [str(v) for v in values]


@router.post("/load_lora_adapter")
async def load_lora_adapter(request: Request) -> Response:
    """SGLang's body {lora_name, lora_path}; its reply {success, error_message,
    loaded_adapters}. A refused adapter (or LoRA being off) is a 400 naming why."""
    try:
        name, path = await _lora_body(request, ("lora_name", "lora_path"))
        tm = server_state(request).manager()
        out = await tm.load_lora_adapter(name, path)
    except RadixGenError as e:
        return error_response(e)
    return json_response(
        {"success": out.success, "error_message": "", "loaded_adapters": dict(tm.lora_paths)}
    )


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> Response:
    """SGLang's body {lora_name}: requests of the adapter in flight finish first."""
    try:
        (name,) = await _lora_body(request, ("lora_name",))
        tm = server_state(request).manager()
        out = await tm.unload_lora_adapter(name)
    except RadixGenError as e:
        return error_response(e)
    return json_response(
        {
            "success": out.success,
            "error_message": "",
            "message": out.message,
            "loaded_adapters": dict(tm.lora_paths),
        }
    )


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    try:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise InvalidRequestError("the body must be a JSON object", None)
        rid = body.get("rid") or ""
        abort_all = bool(body.get("abort_all", False))
        if not isinstance(rid, str):
            raise InvalidRequestError("rid must be a string", "rid")
        if not rid and not abort_all:
            raise InvalidRequestError("give a rid or abort_all: true", "rid")
        tm = server_state(request).manager(while_draining=True)
        await tm.abort_request(rid=rid, abort_all=abort_all)
    except RadixGenError as e:
        return error_response(e)
    return Response(status_code=200)


@router.post("/concate_and_append_request")
async def concate_and_append_request() -> Response:
    """SGLang's frontend calls this on join(mode="concate_and_append") and has already appended
    the text itself; 0.5.23 servers lack the route, so a 200 no-op is the compatible answer."""
    return Response(status_code=200)


# --- tokenizer -----------------------------------------------------------------------------------


@router.post("/tokenize")
@router.post("/v1/tokenize")
async def tokenize(request: Request) -> Response:
    try:
        body = await read_json(request)
        tm = server_state(request).manager()
        if not isinstance(body, dict):
            raise InvalidRequestError("the body must be a JSON object", None)
        prompt = body.get("prompt", body.get("text"))
        add_special = body.get("add_special_tokens", True)
        if not isinstance(add_special, bool):
            raise InvalidRequestError("add_special_tokens must be a boolean", "add_special_tokens")
        tokens: list[int] | list[list[int]]
        count: int | list[int]
        if isinstance(prompt, str):
            tokens = (await tm.encode_texts([prompt], add_special, "prompt"))[0]
            count = len(tokens)
        elif is_str_list(prompt):
            tokens = await tm.encode_texts(prompt, add_special, "prompt")
            count = [len(t) for t in tokens]
        else:
            raise InvalidRequestError("prompt must be a string or a list of strings", "prompt")
    except RadixGenError as e:
        return error_response(e)
    return json_response({"tokens": tokens, "count": count, "max_model_len": tm.context_length})


@router.post("/detokenize")
@router.post("/v1/detokenize")
async def detokenize(request: Request) -> Response:
    try:
        body = await read_json(request)
        tm = server_state(request).manager()
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not is_token_ids(tokens):
            raise InvalidRequestError("tokens must be a list of token ids", "tokens")
        bad = [t for t in tokens if not 0 <= t < tm.vocab_size]
        if bad:
            raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary", "tokens")
        assert isinstance(body, dict)  # a body that is not one has no token list
        skip = body.get("skip_special_tokens", False)
        text = tm.tokenizer.decode(tokens, skip_special_tokens=bool(skip))
    except RadixGenError as e:
        return error_response(e)
    return json_response({"text": text})


# --- metrics -------------------------------------------------------------------------------------


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = server_state(request)
    if state.metrics is None:
        off = error_body(InvalidRequestError("metrics are off; start with --enable-metrics"))
        off["error"]["code"] = 404
        return json_response(off, 404)
    engine_state = None
    live: set[str] = set()
    if state.healthy and state.tm is not None:
        live = {rid for rid, st in state.tm.states.items() if not st.finished}
        try:
            engine_state = await state.tm.get_internal_state()
        except (RadixGenError, asyncio.TimeoutError):
            engine_state = None
    body = state.metrics.render(engine_state, live)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
