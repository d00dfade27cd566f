"""Runs batches: validates the input file, runs its lines through the serving pipeline with a
bounded number in flight, grouped by shared prompt prefix (`ordering.py`), records each line as
it finishes, writes the output and error files (API process, on the server's event loop).
Lines are sent as background work: the scheduler runs them below interactive requests.

A line is run by an `execute(endpoint, body)` callable (the same code the HTTP route runs), so a
batch line and an interactive request are answered alike. An answer of 503 (the server is
loading, draining or its engine died) is not a result: the line stays unrecorded and is run again
later or at the next start. Everything else (2xx or a refusal) is recorded once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from radixgen.json_types import JSONObject
from radixgen.runtime.batch.ordering import cache_aware_order
from radixgen.runtime.batch.store import BatchStore, PendingLine, new_id

logger = logging.getLogger(__name__)

# (status code, response body) of one request, as its HTTP route would answer it
# (endpoint, request body) -> (status code, answer body): a batch line run as its route runs it
Execute = Callable[[str, JSONObject], Awaitable[tuple[int, Mapping[str, object]]]]
RETRY_UNAVAILABLE_S = 1.0
EXPIRED = "batch_expired"


class Unavailable(Exception):
    """The server cannot run requests now (503): try the line again later."""


class BatchRunner:
    def __init__(
        self, store: BatchStore, execute: Execute, max_in_flight: int, max_lines: int
    ) -> None:
        self.store, self.execute, self.max_lines = store, execute, max_lines
        self.slots = asyncio.Semaphore(max_in_flight)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.in_flight: dict[str, set[asyncio.Task[None]]] = {}

    def resume(self) -> None:
        """Start every batch a previous server left unfinished."""
        for batch_id in self.store.active_batch_ids():
            logger.info("resuming batch %s (%s)", batch_id, self.store.status(batch_id))
            self.start(batch_id)

    def start(self, batch_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._run(batch_id))
        self.tasks[batch_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(batch_id, None))

    def cancel(self, batch_id: str) -> None:
        """cancelling now; the lines in flight are stopped, then cancelled with what finished."""
        self.store.set_status(batch_id, "cancelling")
        for task in self.in_flight.get(batch_id, set()):
            task.cancel()

    async def close(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    # --- one batch -----------------------------------------------------------------------------

    async def _run(self, batch_id: str) -> None:
        try:
            if self.store.status(batch_id) == "validating":
                self._validate(batch_id)
            if self.store.status(batch_id) == "in_progress":
                await self._run_lines(batch_id)
            if self.store.status(batch_id) in ("finalizing", "cancelling"):
                self._finalize(batch_id)
        except asyncio.CancelledError:
            raise  # the server stops: the batch resumes at the next start
        except Exception as e:  # a bug: the batch fails with the reason, the server stays up
            logger.exception("batch %s failed", batch_id)
            errors = {"object": "list", "data": [{"code": "internal_error", "message": repr(e)}]}
            self.store.set_status(batch_id, "failed", errors=json.dumps(errors))

    def _validate(self, batch_id: str) -> None:
        """Parse the input file into lines. A line that is not a request of this batch's endpoint
        is recorded failed at once (it goes to the error file); a duplicate custom_id, an empty
        or too long file fails the whole batch, as OpenAI's validation does."""
        batch = self.store.get_batch(batch_id)
        assert batch is not None
        path = self.store.file_path(batch["input_file_id"])
        lines: list[tuple[int, str, JSONObject]] = []
        bad: list[tuple[int, str, JSONObject]] = []
        seen: dict[str, int] = {}
        errors: list[JSONObject] = []
        with path.open("rb") as f:
            raw_lines = [ln for ln in f.read().split(b"\n") if ln.strip()]
        if not raw_lines:
            errors.append({"code": "empty_file", "message": "the input file holds no requests"})
        if len(raw_lines) > self.max_lines:
            errors.append({"code": "too_many_requests", "message":
                           f"the input file holds {len(raw_lines)} requests; the limit is "
                           f"{self.max_lines} (--max-file-lines)"})  # fmt: skip
        for n, raw in enumerate(raw_lines[: self.max_lines], start=1):
            custom_id, request, problem = parse_line(raw, batch["endpoint"])
            if custom_id is not None:
                if custom_id in seen:
                    errors.append({"code": "duplicate_custom_id", "line": n, "param": "custom_id",
                                   "message": f"custom_id {custom_id!r} is also on line "
                                              f"{seen[custom_id]}; each must be unique"})  # fmt: skip
                seen[custom_id] = n
            if problem is None:
                lines.append((n, str(custom_id), request))
            else:
                bad.append((n, custom_id or "", {"problem": problem}))
        if errors:
            failed = {"object": "list", "data": errors}
            self.store.set_status(batch_id, "failed", errors=json.dumps(failed))
            return
        self.store.add_lines(batch_id, sorted(lines + bad))
        for n, custom_id, info in bad:
            self.store.finish_line(batch_id, n, _line_error(custom_id, "invalid_request",
                                                            str(info["problem"])), ok=False)  # fmt: skip
        self.store.set_status(batch_id, "in_progress")

    async def _run_lines(self, batch_id: str) -> None:
        batch = self.store.get_batch(batch_id)
        assert batch is not None
        endpoint, expires_at = batch["endpoint"], batch["expires_at"]
        running: set[asyncio.Task[None]] = set()
        self.in_flight[batch_id] = running
        try:
            # lines sharing a prompt prefix run together (cache hits whatever the input order)
            pending = cache_aware_order(self.store.pending_lines(batch_id), lambda ln: ln.request)
            for line in pending:
                await self.slots.acquire()
                if self.store.status(batch_id) != "in_progress":
                    self.slots.release()
                    break
                if time.time() > expires_at:
                    self.slots.release()
                    self._expire(batch_id)
                    break
                task = asyncio.get_running_loop().create_task(self._one(batch_id, endpoint, line))
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.gather(*list(running), return_exceptions=True)
        finally:
            for task in running:
                task.cancel()
            self.in_flight.pop(batch_id, None)
        if self.store.status(batch_id) == "in_progress":
            self.store.set_status(batch_id, "finalizing")

    async def _one(self, batch_id: str, endpoint: str, line: PendingLine) -> None:
        try:
            while True:
                try:
                    status, body = await self.execute(endpoint, line.request)
                    break
                except Unavailable:
                    await asyncio.sleep(RETRY_UNAVAILABLE_S)
            record = {
                "id": new_id("batch_req_"),
                "custom_id": line.custom_id,
                "response": {"status_code": status, "request_id": body.get("id") or new_id("req_"),
                             "body": body},
                "error": None,
            }  # fmt: skip
            self.store.finish_line(batch_id, line.line_no, record, ok=200 <= status < 300)
        finally:
            self.slots.release()

    def _expire(self, batch_id: str) -> None:
        """Past the completion window: the unfinished lines end in the error file (the batch
        then finalizes as expired)."""
        for line in self.store.pending_lines(batch_id):
            message = "the batch expired before this request was run"
            record = _line_error(line.custom_id, EXPIRED, message)
            self.store.finish_line(batch_id, line.line_no, record, ok=False)

    def _finalize(self, batch_id: str) -> None:
        """Output and error files, line for line in input order; then the final status:
        cancelled, expired (its unrun lines were recorded so) or completed."""
        done = self.store.finished_lines(batch_id)
        if self.store.status(batch_id) == "cancelling":
            final = "cancelled"
        elif any((r.get("error") or {}).get("code") == EXPIRED for r, _ in done):
            final = "expired"
        else:
            final = "completed"
        fields: dict[str, Any] = {}
        for ok, column, name in (
            (True, "output_file_id", "output"),
            (False, "error_file_id", "errors"),
        ):
            records = [r for r, good in done if good is ok]
            if records:
                data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
                file = self.store.add_file(f"batch_{batch_id}_{name}.jsonl", "batch_output", data)
                fields[column] = file["id"]
        self.store.set_status(batch_id, final, **fields)
        logger.info("batch %s %s: %d completed, %d failed", batch_id, final,
                    sum(ok for _, ok in done), sum(not ok for _, ok in done))  # fmt: skip


def parse_line(raw: bytes, endpoint: str) -> tuple[str | None, JSONObject, str | None]:
    """(custom_id, request body, what is wrong with the line or None)."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return None, {}, f"the line is not valid JSON: {e}"
    if not isinstance(obj, dict):
        return None, {}, "the line is not a JSON object"
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, {}, "custom_id must be a non-empty string"
    if obj.get("method", "POST") != "POST":
        return custom_id, {}, f"method must be POST, got {obj.get('method')!r}"
    url = obj.get("url")
    if url is not None and not isinstance(url, str):
        return custom_id, {}, f"url must be a string, got {_json_kind(url)}"
    if url != endpoint:
        return custom_id, {}, f"url {url!r} is not this batch's endpoint {endpoint}"
    body = obj.get("body")
    if not isinstance(body, dict):
        return custom_id, {}, "body must be a JSON object"
    if body.get("stream"):
        return custom_id, {}, "stream is not supported in a batch"
    return custom_id, body, None


def _json_kind(value: object) -> str:
    """What a decoded JSON value is, as the error messages name it."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a string" if isinstance(value, str) else "null"


def _line_error(custom_id: str, code: str, message: str) -> JSONObject:
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id or None,
        "response": None,
        "error": {"code": code, "message": message},
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
