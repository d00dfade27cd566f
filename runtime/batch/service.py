"""The Files and Batch APIs' state for one server: the store and the runner, opened on first use
or at start when a previous server left a database (API process)."""

from __future__ import annotations

import logging
from pathlib import Path

from radixgen.runtime.batch.runner import BatchRunner, Execute
from radixgen.runtime.batch.store import BatchStore, DataDirBusyError
from radixgen.server_args import BatchConfig

logger = logging.getLogger(__name__)

DEFAULT_DATA_DIR = "~/.cache/radixgen/data"


def data_dir(config: BatchConfig) -> Path:
    return Path(config.data_dir or DEFAULT_DATA_DIR).expanduser()


class BatchService:
    def __init__(self, config: BatchConfig, execute: Execute) -> None:
        self.config = config
        self.store = BatchStore(data_dir(config))
        self.runner = BatchRunner(
            self.store, execute, config.batch_max_in_flight, config.max_file_lines
        )
        self.runner.resume()

    @staticmethod
    def resume_if_left(config: BatchConfig, execute: Execute) -> BatchService | None:
        """At start: reopen a database a previous server left (its unfinished batches go on);
        none is made when there is none, and one another server holds is left to it."""
        if not (data_dir(config) / "batches.sqlite3").exists():
            return None
        try:
            return BatchService(config, execute)
        except DataDirBusyError as e:
            logger.warning("batches not resumed: %s", e)
            return None

    async def close(self) -> None:
        await self.runner.close()
        self.store.close()
