"""Embedding requests in the API process: checked, sent to the scheduler as prefill-only
`TokenizedEmbeddingReq`s, and answered from its `BatchEmbeddingOut` by rid.

Owned by the TokenizerManager (which routes the scheduler's outputs here); a request is one
future per input, so a batch of inputs is spread over the scheduler's steps like any other.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from radixgen.errors import EngineDeadError, InternalError, InvalidRequestError
from radixgen.io_struct import AbortReq, BatchEmbeddingOut, EmbeddingVector, TokenizedEmbeddingReq


@dataclass(frozen=True)
class EmbeddingResult:
    embedding: list[float]
    prompt_tokens: int
    cached_tokens: int = 0


class EmbeddingRequests:
    """The embedding requests in flight, by rid."""

    def __init__(
        self,
        send: Callable[[TokenizedEmbeddingReq], Awaitable[object]],
        abort: Callable[[AbortReq], Awaitable[object]],
        embedding_dim: int,
        max_input_tokens: int,
        vocab_size: int,
    ) -> None:
        self._send, self._abort = send, abort
        self.embedding_dim = embedding_dim
        self.max_input_tokens = max_input_tokens
        self.vocab_size = vocab_size
        self._futures: dict[str, asyncio.Future[EmbeddingResult]] = {}

    def __len__(self) -> int:
        return len(self._futures)

    def check(self, inputs: list[list[int]], dimensions: int | None, param: str) -> None:
        """Refuse what the model cannot embed before anything is sent (400 naming the limit)."""
        if not inputs:
            raise InvalidRequestError("input is empty: give at least one text or token list", param)
        for i, ids in enumerate(inputs):
            where = f"{param}[{i}]" if len(inputs) > 1 else param
            if not ids:
                raise InvalidRequestError(f"{where} is empty", param)
            if len(ids) > self.max_input_tokens:
                raise InvalidRequestError(
                    f"{where} has {len(ids)} tokens; this model takes at most "
                    f"{self.max_input_tokens} tokens per input",
                    param,
                )
            bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(
                    f"{where} holds token id {bad}, outside the vocabulary (0..{self.vocab_size - 1})",
                    param,
                )
        if dimensions is not None and not 1 <= dimensions <= self.embedding_dim:
            raise InvalidRequestError(
                f"dimensions must be between 1 and {self.embedding_dim} (the model's width), "
                f"got {dimensions}",
                "dimensions",
            )

    async def embed(
        self,
        inputs: list[list[int]],
        dimensions: int | None,
        param: str,
        token_types: list[list[int]] | None = None,
    ) -> list[EmbeddingResult]:
        """One result per input, in order; a cancelled caller aborts what is still queued.
        token_types: a cross-encoder's segment ids, one list per input."""
        self.check(inputs, dimensions, param)
        types: list[list[int] | None] = list(token_types) if token_types else [None] * len(inputs)
        loop = asyncio.get_running_loop()
        rids = [uuid.uuid4().hex for _ in inputs]
        futures = [loop.create_future() for _ in inputs]
        for rid, fut in zip(rids, futures, strict=True):
            self._futures[rid] = fut
        try:
            for rid, ids, seg in zip(rids, inputs, types, strict=True):
                await self._send(TokenizedEmbeddingReq(rid, ids, dimensions, time.time(), seg))
            return list(await asyncio.gather(*futures))
        except asyncio.CancelledError:
            for rid, fut in zip(rids, futures, strict=True):
                if not fut.done():
                    await self._abort(AbortReq(rid=rid))
            raise
        finally:
            for rid in rids:
                self._futures.pop(rid, None)

    def on_outputs(self, out: BatchEmbeddingOut) -> list[str]:
        """Resolve the futures of the answered rids; returns the rids (finished, for routing)."""
        for answer in out.outputs:
            fut = self._futures.get(answer.rid)
            if fut is None or fut.done():
                continue
            if isinstance(answer, EmbeddingVector):
                fut.set_result(
                    EmbeddingResult(answer.values, answer.prompt_tokens, answer.cached_tokens)
                )
            elif answer.status == 400:
                fut.set_exception(InvalidRequestError(answer.message, "input"))
            else:
                fut.set_exception(InternalError(answer.message))
        return out.rids

    def fail_all(self, reason: str) -> None:
        """The engine died: every waiting caller gets a 503."""
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(reason))
