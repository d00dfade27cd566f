"""OpenAI's Files and Batch APIs: /v1/files and /v1/batches (API process).

Objects are shaped as OpenAI's (the openai SDK parses them); state lives in `radixgen.runtime.batch`
(SQLite + a folder under --data-dir) and survives restarts. Batch lines run through the same code
as the HTTP routes (`run_chat_completion`, `run_completion`, `run_response`,
`run_embedding`), behind the API key like every route.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, cast

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response
from starlette.datastructures import UploadFile

from radixgen.errors import InvalidRequestError, RadixGenError, RequestTooLargeError
from radixgen.json_types import JSONObject
from radixgen.runtime.batch.runner import Execute, Unavailable
from radixgen.runtime.batch.service import BatchService
from radixgen.runtime.batch.store import DataDirBusyError
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.openai.serving_chat import run_chat_completion
from radixgen.runtime.entrypoints.openai.serving_common import Answer, ServingState
from radixgen.runtime.entrypoints.openai.serving_completions import run_completion
from radixgen.runtime.entrypoints.openai.serving_embedding import run_embedding
from radixgen.runtime.entrypoints.openai.serving_responses import run_response

if TYPE_CHECKING:
    from radixgen.runtime.entrypoints.server_state import ServerState

router = APIRouter()
_P = ParamSpec("_P")

RunOne = Callable[[ServingState, JSONObject], Awaitable[Answer]]
# the endpoints a batch may target, and how one of their requests is run without HTTP
BATCH_ENDPOINTS: dict[str, RunOne] = {
    "/v1/chat/completions": run_chat_completion,
    "/v1/completions": run_completion,
    "/v1/responses": run_response,
    "/v1/embeddings": run_embedding,  # on an embedding server (--is-embedding)
}
COMPLETION_WINDOWS = {"24h": 24 * 3600}  # OpenAI accepts only 24h
FILE_PURPOSES = ("batch",)
MAX_METADATA_KEYS = 16
PAGE_DEFAULT, PAGE_MAX = 20, 100
MULTIPART_OVERHEAD = 64 * 1024  # form fields and boundaries beside the file's bytes


def batch_executor(
    state: ServerState,
) -> Execute:
    async def execute(endpoint: str, body: JSONObject) -> Answer:
        status, answer = await BATCH_ENDPOINTS[endpoint](state, body)
        if status == 503:  # loading, draining or dead: not the line's answer (an error body)
            raise Unavailable(cast(hu.ErrorBody, answer)["error"]["message"])
        return status, answer

    return execute


def resume_batches(state: ServerState) -> None:
    """At server start: unfinished batches of a previous run go on."""
    if state.batch is None:
        state.batch = BatchService.resume_if_left(state.args.batch, batch_executor(state))


def _service(request: Request) -> BatchService:
    state = request.app.state.server
    if state.batch is None:
        try:
            state.batch = BatchService(state.args.batch, batch_executor(state))
        except DataDirBusyError as e:
            raise hu.ServiceBusyError(str(e)) from e
    service: BatchService = state.batch
    return service


def _page_args(request: Request) -> tuple[int, str | None]:
    raw = request.query_params.get("limit", str(PAGE_DEFAULT))
    try:
        limit = int(raw)
    except ValueError:
        raise InvalidRequestError(f"limit must be an integer, got {raw!r}", "limit") from None
    if not 1 <= limit <= PAGE_MAX:
        raise InvalidRequestError(f"limit must be in [1, {PAGE_MAX}], got {limit}", "limit")
    return limit, request.query_params.get("after")


def _page(items: Sequence[Mapping[str, object]], limit: int) -> dict[str, object]:
    """OpenAI's cursor page: `limit + 1` items were fetched to tell whether more follow."""
    data = items[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > limit,
    }


def _guard(handler: Callable[_P, Awaitable[Response]]) -> Callable[_P, Awaitable[Response]]:
    """Our errors become OpenAI-shaped error answers (404, 400, 413, 503)."""

    @functools.wraps(handler)  # FastAPI reads the handler's parameters through __wrapped__
    async def run(*args: _P.args, **kwargs: _P.kwargs) -> Response:
        try:
            return await handler(*args, **kwargs)
        except RadixGenError as e:
            return hu.error_response(e)

    return run


# --- files -----------------------------------------------------------------------------------


@router.post("/v1/files")
@_guard
async def create_file(request: Request) -> Response:
    service = _service(request)
    limit = service.config.max_file_bytes
    declared = int(request.headers.get("content-length") or 0)
    if declared > limit + MULTIPART_OVERHEAD:
        raise RequestTooLargeError(
            f"the upload is {declared} bytes; files may be at most {limit} bytes "
            "(--max-file-bytes)", "file"
        )  # fmt: skip
    form = await request.form(max_files=1, max_fields=8)
    try:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise InvalidRequestError(
                "a multipart field 'file' holding the file is required", "file"
            )
        if purpose not in FILE_PURPOSES:
            raise InvalidRequestError(
                f"purpose must be one of {list(FILE_PURPOSES)}, got {purpose!r}", "purpose"
            )
        staged = await asyncio.to_thread(_stage, upload, service, limit)
        filename = upload.filename or "upload.jsonl"
        return hu.json_response(service.store.add_file(filename, str(purpose), staged))
    finally:
        await form.close()


def _stage(upload: UploadFile, service: BatchService, limit: int) -> Path:
    """Copy the spooled upload into the data folder, checking its size and line count."""
    fd, name = tempfile.mkstemp(dir=service.store.files_dir, suffix=".part")
    path = Path(name)
    try:
        with open(fd, "wb") as out:
            upload.file.seek(0)
            shutil.copyfileobj(upload.file, out, 1 << 20)
        size = path.stat().st_size
        if size > limit:
            raise RequestTooLargeError(
                f"the file is {size} bytes; files may be at most {limit} bytes (--max-file-bytes)",
                "file",
            )
        lines = sum(1 for ln in path.open("rb") if ln.strip())
        if lines > service.config.max_file_lines:
            raise InvalidRequestError(
                f"the file holds {lines} request lines; the limit is "
                f"{service.config.max_file_lines} (--max-file-lines)", "file"
            )  # fmt: skip
        return path
    except BaseException:
        path.unlink(missing_ok=True)
        raise


@router.get("/v1/files")
@_guard
async def list_files(request: Request) -> Response:
    limit, after = _page_args(request)
    purpose = request.query_params.get("purpose")
    return hu.json_response(
        _page(_service(request).store.list_files(purpose, limit + 1, after), limit)
    )


def _file(request: Request, file_id: str) -> JSONObject:
    found = _service(request).store.get_file(file_id)
    if found is None:
        raise hu.NotFoundError(f"no file with id {file_id!r}")
    return found


@router.get("/v1/files/{file_id}")
@_guard
async def retrieve_file(file_id: str, request: Request) -> Response:
    return hu.json_response(_file(request, file_id))


@router.get("/v1/files/{file_id}/content")
@_guard
async def file_content(file_id: str, request: Request) -> Response:
    _file(request, file_id)
    path = _service(request).store.file_path(file_id)
    return FileResponse(path, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
@_guard
async def delete_file(file_id: str, request: Request) -> Response:
    if not _service(request).store.delete_file(file_id):
        raise hu.NotFoundError(f"no file with id {file_id!r}")
    return hu.json_response({"id": file_id, "object": "file", "deleted": True})


# --- batches ---------------------------------------------------------------------------------


@router.post("/v1/batches")
@_guard
async def create_batch(request: Request) -> Response:
    body = await hu.read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", None)
    service = _service(request)
    unknown = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata",
                                  "output_expires_after"})  # fmt: skip
    if unknown:
        raise InvalidRequestError(f"unknown field '{unknown[0]}'", unknown[0])
    endpoint = body.get("endpoint")
    if endpoint not in BATCH_ENDPOINTS:
        raise InvalidRequestError(
            f"endpoint must be one of {sorted(BATCH_ENDPOINTS)}, got {endpoint!r}", "endpoint"
        )
    window = body.get("completion_window")
    if window not in COMPLETION_WINDOWS:
        raise InvalidRequestError(
            f"completion_window must be one of {sorted(COMPLETION_WINDOWS)}, got {window!r}",
            "completion_window",
        )
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict)
        and len(metadata) <= MAX_METADATA_KEYS
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise InvalidRequestError(
            f"metadata must be an object of at most {MAX_METADATA_KEYS} string values", "metadata"
        )
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str):
        raise InvalidRequestError("input_file_id must be a file id", "input_file_id")
    file = service.store.get_file(file_id)
    if file is None:
        raise hu.NotFoundError(f"no file with id {file_id!r}")
    if file["purpose"] != "batch":
        raise InvalidRequestError(
            f"file {file_id} has purpose {file['purpose']!r}; a batch needs purpose 'batch'",
            "input_file_id",
        )
    batch = service.store.add_batch(endpoint, file_id, COMPLETION_WINDOWS[window], window, metadata)
    service.runner.start(batch["id"])
    return hu.json_response(batch)


def _batch(service: BatchService, batch_id: str) -> dict[str, Any]:
    found = service.store.get_batch(batch_id)
    if found is None:
        raise hu.NotFoundError(f"no batch with id {batch_id!r}")
    return found


@router.get("/v1/batches")
@_guard
async def list_batches(request: Request) -> Response:
    limit, after = _page_args(request)
    return hu.json_response(_page(_service(request).store.list_batches(limit + 1, after), limit))


@router.get("/v1/batches/{batch_id}")
@_guard
async def retrieve_batch(batch_id: str, request: Request) -> Response:
    return hu.json_response(_batch(_service(request), batch_id))


@router.post("/v1/batches/{batch_id}/cancel")
@_guard
async def cancel_batch(batch_id: str, request: Request) -> Response:
    service = _service(request)
    batch = _batch(service, batch_id)
    if batch["status"] not in ("validating", "in_progress", "cancelling"):
        raise InvalidRequestError(
            f"batch {batch_id} is {batch['status']}: only a validating or in-progress batch can "
            "be cancelled", "batch_id"
        )  # fmt: skip
    if batch["status"] != "cancelling":
        service.runner.cancel(batch_id)
    return hu.json_response(_batch(service, batch_id))
