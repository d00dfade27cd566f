"""Durable state of the Files and Batch APIs: file bytes in a folder, metadata and per-line
results in SQLite (API process).

One server owns a data folder at a time (an exclusive `flock` on `<data_dir>/lock`), so the
database has one writer: the API process's event loop. WAL mode keeps a commit cheap (no fsync per
line with synchronous=NORMAL; a commit survives the process being killed, only a power loss can
lose the last ones). A batch line is recorded when it finishes, in the same transaction as its
batch's counts, so a restart runs exactly the lines without a record.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixgen.json_types import JSONObject

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, times TEXT NOT NULL, output_file_id TEXT, error_file_id TEXT,
    errors TEXT, metadata TEXT, total INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL,
    request TEXT NOT NULL, result TEXT, ok INTEGER,
    PRIMARY KEY (batch_id, line_no)
);
"""

# statuses a batch is still worked on in (a restart resumes them)
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
# each status's timestamp field in OpenAI's batch object
STATUS_TIME = {
    "in_progress": "in_progress_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "failed": "failed_at",
    "expired": "expired_at",
    "cancelling": "cancelling_at",
    "cancelled": "cancelled_at",
}


# a value stored in one of the store's SQLite columns
SQLValue = str | int | float | None


class DataDirBusyError(RuntimeError):
    """Another live server holds this data folder."""


@dataclass(frozen=True)
class PendingLine:
    line_no: int
    custom_id: str
    request: JSONObject


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


class BatchStore:
    def __init__(self, data_dir: str | Path) -> None:
        self.root = Path(data_dir).expanduser()
        self.files_dir = self.root / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.root / "lock", "a+")  # noqa: SIM115 - held for the store's life
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            self._lock.close()
            raise DataDirBusyError(
                f"the data folder {self.root} is in use by another server (give this one its own "
                "--data-dir)"
            ) from e
        self.db = sqlite3.connect(self.root / "batches.sqlite3", isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()
        self._lock.close()  # releases the flock

    # --- files ----------------------------------------------------------------------------------

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def add_file(self, filename: str, purpose: str, data: bytes | Path) -> JSONObject:
        """Store the bytes (or move a spooled upload into place), then the record."""
        file_id = new_id("file-")
        target = self.file_path(file_id)
        if isinstance(data, Path):
            os.replace(data, target)
        else:
            tmp = target.with_suffix(".part")
            tmp.write_bytes(data)
            os.replace(tmp, target)
        size = target.stat().st_size
        self.db.execute(
            "INSERT INTO files VALUES (?, ?, ?, ?, ?)",
            (file_id, filename, purpose, size, int(time.time())),
        )
        return self.get_file(file_id) or {}

    def get_file(self, file_id: str) -> JSONObject | None:
        row = self.db.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
        return None if row is None else _file_object(row)

    def list_files(self, purpose: str | None, limit: int, after: str | None) -> list[JSONObject]:
        """Newest first, as OpenAI lists them; `after` is the last id of the previous page."""
        return [_file_object(r) for r in self._page("files", limit, after, purpose=purpose)]

    def delete_file(self, file_id: str) -> bool:
        gone = self.db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount > 0
        if gone:
            self.file_path(file_id).unlink(missing_ok=True)
        return gone

    # --- batches --------------------------------------------------------------------------------

    def add_batch(
        self,
        endpoint: str,
        input_file_id: str,
        window_s: int,
        window: str,
        metadata: JSONObject | None,
    ) -> dict[str, Any]:
        batch_id = new_id("batch_")
        now = int(time.time())
        self.db.execute(
            "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, "
            "created_at, expires_at, times, metadata) VALUES (?, ?, ?, ?, 'validating', ?, ?, "
            "'{}', ?)",
            (batch_id, endpoint, input_file_id, window, now, now + window_s,
             None if metadata is None else json.dumps(metadata)),
        )  # fmt: skip
        return self.get_batch(batch_id) or {}

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return None if row is None else _batch_object(row)

    def list_batches(self, limit: int, after: str | None) -> list[dict[str, Any]]:
        return [_batch_object(r) for r in self._page("batches", limit, after)]

    def active_batch_ids(self) -> list[str]:
        marks = ",".join("?" * len(ACTIVE))
        rows = self.db.execute(
            f"SELECT id FROM batches WHERE status IN ({marks}) ORDER BY created_at, rowid", ACTIVE
        )
        return [r["id"] for r in rows]

    def status(self, batch_id: str) -> str:
        row = self.db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return str(row["status"])

    def set_status(self, batch_id: str, status: str, **fields: SQLValue) -> None:
        """Move to `status`, stamping its time (once) and setting other columns."""
        row = self.db.execute("SELECT times FROM batches WHERE id = ?", (batch_id,)).fetchone()
        times = json.loads(row["times"])
        if status in STATUS_TIME:
            times.setdefault(STATUS_TIME[status], int(time.time()))
        cols = {"status": status, "times": json.dumps(times), **fields}
        assign = ", ".join(f"{k} = ?" for k in cols)
        self.db.execute(f"UPDATE batches SET {assign} WHERE id = ?", (*cols.values(), batch_id))

    def add_lines(self, batch_id: str, lines: list[tuple[int, str, JSONObject]]) -> None:
        """The validated input, once (a resumed validation replaces a partial insert)."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
            self.db.executemany(
                "INSERT INTO lines (batch_id, line_no, custom_id, request) VALUES (?, ?, ?, ?)",
                [(batch_id, n, cid, json.dumps(req)) for n, cid, req in lines],
            )
            self.db.execute("UPDATE batches SET total = ? WHERE id = ?", (len(lines), batch_id))

    def pending_lines(self, batch_id: str) -> list[PendingLine]:
        rows = self.db.execute(
            "SELECT line_no, custom_id, request FROM lines WHERE batch_id = ? AND result IS NULL "
            "ORDER BY line_no",
            (batch_id,),
        )
        return [PendingLine(r[0], r[1], json.loads(r[2])) for r in rows]

    def finish_line(
        self, batch_id: str, line_no: int, result: Mapping[str, object], ok: bool
    ) -> None:
        """One line's output record and its batch's count, in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            changed = self.db.execute(
                "UPDATE lines SET result = ?, ok = ? WHERE batch_id = ? AND line_no = ? "
                "AND result IS NULL",
                (json.dumps(result), int(ok), batch_id, line_no),
            ).rowcount
            if changed:
                column = "completed" if ok else "failed"
                self.db.execute(
                    f"UPDATE batches SET {column} = {column} + 1 WHERE id = ?", (batch_id,)
                )

    def finished_lines(self, batch_id: str) -> list[tuple[dict[str, Any], bool]]:
        rows = self.db.execute(
            "SELECT result, ok FROM lines WHERE batch_id = ? AND result IS NOT NULL "
            "ORDER BY line_no",
            (batch_id,),
        )
        return [(json.loads(r[0]), bool(r[1])) for r in rows]

    def _page(self, table: str, limit: int, after: str | None, **eq: SQLValue) -> list[sqlite3.Row]:
        where: list[str] = []
        params: list[SQLValue] = []
        for key, value in eq.items():
            if value is not None:
                where.append(f"{key} = ?")
                params.append(value)
        if after is not None:
            where.append(f"rowid < (SELECT rowid FROM {table} WHERE id = ?)")
            params.append(after)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT * FROM {table} {clause} ORDER BY rowid DESC LIMIT ?"
        return list(self.db.execute(sql, (*params, limit)))


def _file_object(row: sqlite3.Row) -> JSONObject:
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": row["created_at"],
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def _batch_object(row: sqlite3.Row) -> dict[str, Any]:
    times = json.loads(row["times"])
    return {
        "id": row["id"],
        "object": "batch",
        "endpoint": row["endpoint"],
        "errors": None if row["errors"] is None else json.loads(row["errors"]),
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"],
        "status": row["status"],
        "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"],
        "created_at": row["created_at"],
        "expires_at": row["expires_at"],
        **{field: times.get(field) for field in STATUS_TIME.values()},
        "request_counts": {
            "total": row["total"],
            "completed": row["completed"],
            "failed": row["failed"],
        },
        "metadata": None if row["metadata"] is None else json.loads(row["metadata"]),
    }
