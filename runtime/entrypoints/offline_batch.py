"""`radixgen batch -i in.jsonl -o out.jsonl`: a Batch API input file run offline, in-process
(user's process).

The lines are OpenAI batch requests (`custom_id`, `method`, `url`, `body`) for
/v1/chat/completions or /v1/completions, run by the same code as the server's routes on an
in-process `Engine`, a bounded number in flight. Each answer is appended to the output file (2xx)
or the error file (the rest) as it finishes, flushed, so `--resume` after a crash or Ctrl-C runs
only the custom_ids neither file holds yet. A tqdm bar shows lines done, tok/s and the ETA.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from tqdm import tqdm

from radixgen.errors import InvalidRequestError
from radixgen.json_types import JSONObject, JSONValue
from radixgen.runtime.batch.ordering import cache_aware_order
from radixgen.runtime.batch.runner import parse_line
from radixgen.runtime.batch.store import new_id
from radixgen.runtime.entrypoints.openai.files_batches import BATCH_ENDPOINTS
from radixgen.runtime.entrypoints.openai.responses_store import ResponseStore
from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager
from radixgen.server_args import ServerArgs

if TYPE_CHECKING:
    from radixgen.runtime.entrypoints.engine import Engine


@dataclass(frozen=True)
class OfflineLine:
    line_no: int
    custom_id: str
    url: str
    body: JSONObject


def error_path_for(output: str) -> str:
    """The error file beside the output: out.jsonl -> out.errors.jsonl."""
    path = Path(output)
    return str(path.with_name(path.stem + ".errors" + (path.suffix or ".jsonl")))


def read_lines(
    source: IO[bytes], endpoints: set[str]
) -> tuple[list[OfflineLine], list[JSONObject]]:
    """The runnable lines, and the error records of the bad ones (a duplicate custom_id is an
    InvalidRequestError: the whole input is refused, as the Batch API's validation does)."""
    good: list[OfflineLine] = []
    bad: list[JSONObject] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate((ln for ln in source if ln.strip()), start=1):
        url = _url_of(raw)
        # a url of another JSON type (a list is unhashable) is parse_line's error for the line
        known = isinstance(url, str) and url in endpoints
        target = str(url) if known else "/v1/chat/completions"
        custom_id, body, problem = parse_line(raw, target)
        if custom_id is not None:
            if custom_id in seen:
                raise InvalidRequestError(
                    f"line {n}: custom_id {custom_id!r} is also on line {seen[custom_id]}; "
                    "each must be unique", "custom_id"
                )  # fmt: skip
            seen[custom_id] = n
        if problem is None and known:
            good.append(OfflineLine(n, str(custom_id), target, body))
        else:
            problem = problem or f"url {url!r} is not one of {sorted(endpoints)}"
            bad.append(_error_record(custom_id, f"line {n}: {problem}"))
    return good, bad


def _url_of(raw: bytes) -> JSONValue:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj.get("url") if isinstance(obj, dict) else None


def _error_record(custom_id: str | None, message: str) -> JSONObject:
    return {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None,
            "error": {"code": "invalid_request", "message": message}}  # fmt: skip


def done_custom_ids(*paths: str) -> set[str]:
    """custom_ids already answered in these JSONL files (a torn last line is ignored)."""
    done: set[str] = set()
    for path in paths:
        if path == "-" or not Path(path).exists():
            continue
        for raw in Path(path).read_bytes().splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue  # the line a crash cut short: its request runs again
            if isinstance(record, dict) and isinstance(record.get("custom_id"), str):
                done.add(record["custom_id"])
    return done


@contextmanager
def _sink(path: str, append: bool) -> Iterator[IO[str]]:
    if path == "-":
        yield sys.stdout
        return
    if append:
        _drop_torn_tail(Path(path))
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        yield f


def _drop_torn_tail(path: Path) -> None:
    """A crash mid-write can leave a last line without its newline: cut it before appending."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


class OfflineState:
    """What the routes' run functions need of a server (`manager()`, `args`), over an Engine."""

    def __init__(self, args: ServerArgs, manager: TokenizerManager) -> None:
        self.args, self._manager = args, manager
        self.responses = ResponseStore()  # /v1/responses lines' own (previous_response_id)

    def manager(self, while_draining: bool = False) -> TokenizerManager:
        return self._manager


@dataclass
class PreparedBatch:
    """The input read and checked before any engine starts (a refused file costs no start)."""

    todo: list[OfflineLine]
    bad: list[JSONObject]
    skipped: int
    output_path: str
    error_path: str
    resume: bool


def prepare_batch(
    input_path: str, output_path: str, error_path: str, resume: bool
) -> PreparedBatch:
    source = sys.stdin.buffer if input_path == "-" else open(input_path, "rb")  # noqa: SIM115
    with source:
        lines, bad = read_lines(source, set(BATCH_ENDPOINTS))
    skip = done_custom_ids(output_path, error_path) if resume else set()
    todo = [ln for ln in lines if ln.custom_id not in skip]
    if resume and error_path != "-" and Path(error_path).exists():
        # the first run wrote every bad line first; lines without a custom_id have no other key
        bad = [r for r in bad if r["custom_id"] is not None and r["custom_id"] not in skip]
    return PreparedBatch(todo, bad, len(skip), output_path, error_path, resume)


def run_batch(engine: Engine, batch: PreparedBatch) -> tuple[int, int]:
    """Run the lines on `engine`; returns (lines answered 2xx, records in the error file)."""
    state = OfflineState(engine.server_args, engine.tokenizer_manager)
    counts = {"ok": 0, "failed": 0, "tokens": 0}
    total = len(batch.todo) + len(batch.bad) + batch.skipped
    bar = tqdm(total=total, initial=batch.skipped, unit="line", desc="batch",
               dynamic_ncols=True, file=sys.stderr)  # fmt: skip
    with (
        _sink(batch.output_path, batch.resume) as out,
        _sink(batch.error_path, batch.resume) as err,
    ):
        for record in batch.bad:
            _write(err, record)
            counts["failed"] += 1
            bar.update(1)

        async def one(line: OfflineLine, slots: asyncio.Semaphore) -> None:
            async with slots:
                status, body = await BATCH_ENDPOINTS[line.url](state, line.body)
            record = {"id": new_id("batch_req_"), "custom_id": line.custom_id,
                      "response": {"status_code": status, "request_id": body.get("id") or
                                   new_id("req_"), "body": body},
                      "error": None}  # fmt: skip
            ok = 200 <= status < 300
            _write(out if ok else err, record)
            counts["ok" if ok else "failed"] += 1
            usage = body.get("usage")  # an object when there is one
            counts["tokens"] += usage.get("completion_tokens", 0) if isinstance(usage, dict) else 0
            elapsed = bar.format_dict["elapsed"] or 1e-9
            bar.set_postfix_str(f"{counts['tokens'] / elapsed:.1f} tok/s", refresh=False)
            bar.update(1)

        async def all_lines() -> None:
            slots = asyncio.Semaphore(engine.server_args.batch.batch_max_in_flight)
            # lines sharing a prompt prefix run together (the semaphore admits in this order)
            todo = cache_aware_order(batch.todo, lambda ln: ln.body)
            await asyncio.gather(*(one(line, slots) for line in todo))

        try:
            engine.run(all_lines())
        finally:
            bar.close()
    return counts["ok"], counts["failed"]


def _write(sink: IO[str], record: Mapping[str, object]) -> None:
    sink.write(json.dumps(record, ensure_ascii=False) + "\n")
    sink.flush()
