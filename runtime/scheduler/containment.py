"""Containment helpers (scheduler process): a bug met while handling a request fails it alone.

The scheduler calls these where one request's processing can raise: the request gets a 500 abort
(the client a clean error), the traceback is logged once, and the loop serves on.
"""

from __future__ import annotations

import logging
import traceback
from typing import TYPE_CHECKING

from radixgen.finish_reason import FinishReason

if TYPE_CHECKING:
    from radixgen.runtime.constrained.grammar_manager import GrammarManager
    from radixgen.runtime.scheduler.req import Req

logger = logging.getLogger(__name__)


def internal_error(e: Exception) -> FinishReason:
    """The finish reason of a request failed by a bug: the client gets a clean 500."""
    return FinishReason.abort(f"internal error: {e!r}", 500)


def log_internal_error(stage: str, e: Exception) -> None:
    logger.error("internal error in %s: %s\n%s", stage, e, traceback.format_exc())


def poll_one_by_one(grammars: GrammarManager, reqs: list[Req]) -> tuple[list[Req], list[Req]]:
    """After a failed poll: poll each request alone; one whose poll raises fails with a 500."""
    ready: list[Req] = []
    failed: list[Req] = []
    for req in reqs:
        try:
            r_ready, r_failed = grammars.poll([req])
        except Exception as e:
            log_internal_error(f"grammar polling of request {req.rid}", e)
            req.finish(internal_error(e))
            failed.append(req)
            continue
        ready += r_ready
        failed += r_failed
    return ready, failed
