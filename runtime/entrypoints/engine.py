"""The offline Engine: the server's managers and processes, driven from Python without HTTP.

`Engine(...)` starts the scheduler and detokenizer processes and runs a TokenizerManager on a
private event loop in a background thread; `generate` (sync), `async_generate` and streaming
iterators all go through the very same TokenizerManager code the HTTP server uses.
"""

from __future__ import annotations

import asyncio
import atexit
import queue
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import TypedDict, TypeVar, cast

from radixgen.generate_output import GenerateOutput
from radixgen.io_struct import GenerateReqInput
from radixgen.runtime.entrypoints.embedding_request import (
    EncodeOutput,
    embed_request,
    encode_outputs,
)
from radixgen.runtime.launch.launcher import EngineProcesses, launch_engine_processes
from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager
from radixgen.runtime.text.tokenizer import Tokenizer
from radixgen.server_args import ServerArgs
from radixgen.version import __version__

_WATCH_INTERVAL_S = 0.5
_T = TypeVar("_T")
# what a streaming pump hands its consumer: a chunk, the error that ended it, or None at the end
_Streamed = GenerateOutput | list[GenerateOutput] | BaseException | None


class Engine:
    """An in-process handle on a running RadixGen engine.

    Args mirror the server's flags, e.g. `Engine(dtype="float32", max_total_tokens=8192)`.
    """

    def __init__(self, model_path: str | None = None, **kwargs: object) -> None:
        # NOTE: an offline job submits all its work at once: no queue or per-request sequence
        # limit unless asked for (the prompt and stop-string limits still apply)
        kwargs.setdefault("max_queued_requests", None)
        kwargs.setdefault("max_sequences_per_request", None)
        self.server_args = ServerArgs.from_kwargs(model_path=model_path, **kwargs)
        self._procs: EngineProcesses | None = launch_engine_processes(self.server_args)
        p = self._procs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="radixgen-engine-loop", daemon=True
        )
        self._thread.start()
        if p.ready is None:
            raise RuntimeError("no scheduler reported ready on this machine")
        self.tokenizer_manager = TokenizerManager(
            self.server_args, p.model_folder, p.ports, p.ready, p.served_model_name
        )
        self._call(self._start())
        atexit.register(self.shutdown)

    async def _start(self) -> None:
        self.tokenizer_manager.start()
        self._watch_task = asyncio.get_running_loop().create_task(self._watch_children())

    async def _watch_children(self) -> None:
        while self._procs is not None:
            dead = self._procs.dead_child()
            if dead:
                self.tokenizer_manager.mark_dead(dead)
                return
            await asyncio.sleep(_WATCH_INTERVAL_S)

    def _call(self, coro: Coroutine[object, None, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def run(self, coro: Coroutine[object, None, _T]) -> _T:
        """Run a coroutine on the engine's event loop (where its TokenizerManager lives) and
        wait for its result: for work that drives the manager directly (`radixgen batch`)."""
        return self._call(coro)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.tokenizer_manager.tokenizer

    # --- generation ---------------------------------------------------------------------------

    @staticmethod
    def _request(
        prompt: str | list[str] | None,
        sampling_params: Mapping[str, object] | list[Mapping[str, object]] | None,
        input_ids: list[int] | list[list[int]] | None,
        return_logprob: bool | list[bool],
        logprob_start_len: int | list[int] | None,
        top_logprobs_num: int | list[int] | None,
        stream: bool,
        rid: str | list[str] | None,
        return_text_in_logprobs: bool,
        lora_path: str | list[str | None] | None = None,
        priority: int | None = None,
        pin_prefix: bool = False,
    ) -> GenerateReqInput:
        return GenerateReqInput(
            text=prompt,
            input_ids=input_ids,
            sampling_params=sampling_params,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            stream=stream,
            rid=rid,
            return_text_in_logprobs=return_text_in_logprobs,
            lora_path=lora_path,
            priority=priority,
            pin_prefix=pin_prefix,
        )

    def encode(
        self,
        prompt: str | list[str] | list[int] | list[list[int]],
        dimensions: int | None = None,
        truncate: bool = False,
    ) -> EncodeOutput | list[EncodeOutput]:
        """SGLang's `Engine.encode` on an embedding engine (`Engine(is_embedding=True)`): text or
        token ids, one or a batch -> `{"embedding", "meta_info"}` each (a list for a batch)."""
        work = embed_request(self.tokenizer_manager, prompt, dimensions, "prompt", truncate)
        results, batch = self._call(work)
        return encode_outputs(results, batch)

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: Mapping[str, object] | list[Mapping[str, object]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
        lora_path: str | list[str | None] | None = None,
        priority: int | None = None,
        pin_prefix: bool = False,
    ) -> GenerateOutput | list[GenerateOutput] | Iterator[GenerateOutput]:
        """One dict for one prompt, a list in order for a list; an iterator of chunks if streaming.

        lora_path: the LoRA adapter by name (--lora-paths), one or one per prompt.
        priority: SGLang's request priority (`enable_priority_scheduling`), one for the call.
        pin_prefix: keep the prompt pinned in HiCache's host tier (ignored without the tiers).
        Bad input raises `ValueError` (an `InvalidRequestError`) naming the parameter.
        """
        obj = self._request(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
            top_logprobs_num, stream, rid, return_text_in_logprobs, lora_path, priority,
            pin_prefix,
        )  # fmt: skip
        if stream:
            return self._stream_sync(obj)
        return self._call(self._collect(obj))

    async def _collect(self, obj: GenerateReqInput) -> GenerateOutput | list[GenerateOutput]:
        result = None
        async for item in self.tokenizer_manager.generate(obj):
            result = item
        # NOTE: a call that is not streamed yields exactly once (TokenizerManager.generate)
        return cast("GenerateOutput | list[GenerateOutput]", result)

    def _stream_sync(self, obj: GenerateReqInput) -> Iterator[GenerateOutput]:
        q: queue.Queue[_Streamed] = queue.Queue()

        async def pump() -> None:
            try:
                async for chunk in self.tokenizer_manager.generate(obj):
                    q.put(chunk)
                q.put(None)
            except BaseException as e:  # surfaced to the consumer thread
                q.put(e)

        fut: Future[None] = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield _chunk(item)
        finally:
            if not fut.done():
                fut.cancel()

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: Mapping[str, object] | list[Mapping[str, object]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
        lora_path: str | list[str | None] | None = None,
        priority: int | None = None,
        pin_prefix: bool = False,
    ) -> GenerateOutput | list[GenerateOutput] | AsyncIterator[GenerateOutput]:
        """Awaitable from any event loop; with stream=True returns an async iterator of chunks."""
        obj = self._request(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
            top_logprobs_num, stream, rid, return_text_in_logprobs, lora_path, priority,
            pin_prefix,
        )  # fmt: skip
        if stream:
            return self._stream_async(obj)
        fut = asyncio.run_coroutine_threadsafe(self._collect(obj), self._loop)
        return await asyncio.wrap_future(fut)

    async def _stream_async(self, obj: GenerateReqInput) -> AsyncIterator[GenerateOutput]:
        q: asyncio.Queue[_Streamed] = asyncio.Queue()
        caller_loop = asyncio.get_running_loop()

        async def pump() -> None:
            try:
                async for chunk in self.tokenizer_manager.generate(obj):
                    caller_loop.call_soon_threadsafe(q.put_nowait, chunk)
                caller_loop.call_soon_threadsafe(q.put_nowait, None)
            except BaseException as e:
                caller_loop.call_soon_threadsafe(q.put_nowait, e)

        fut = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield _chunk(item)
        finally:
            if not fut.done():
                fut.cancel()

    # --- control ------------------------------------------------------------------------------

    def flush_cache(self, keep_lower_tiers: bool = False) -> ControlResult:
        """Empty the prefix cache (with HiCache every tier, or only the KV pool with
        `keep_lower_tiers`); refused (success False, with a message) while requests run."""
        out = self._call(self.tokenizer_manager.flush_cache(keep_lower_tiers))
        return {"success": out.success, "message": out.message}

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> ControlResult:
        """SGLang's `Engine.load_lora_adapter`: a PEFT folder under a name, while serving; a
        refused adapter raises `InvalidRequestError` naming why."""
        out = self._call(self.tokenizer_manager.load_lora_adapter(lora_name, lora_path))
        return {"success": out.success, "message": out.message}

    def unload_lora_adapter(self, lora_name: str) -> ControlResult:
        """Unload an adapter: new requests naming it are refused, those in flight finish."""
        out = self._call(self.tokenizer_manager.unload_lora_adapter(lora_name))
        return {"success": out.success, "message": out.message}

    def get_server_info(self) -> dict[str, object]:
        states = self._call(self.tokenizer_manager.get_internal_states())
        return {
            **self.server_args.to_flat_dict(),
            **self.tokenizer_manager.model_info(),
            "version": __version__,
            "internal_states": [s.as_dict() for s in states],
        }

    def shutdown(self) -> None:
        if self._procs is None:
            return
        procs, self._procs = self._procs, None
        try:
            self._call(self._close())
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        procs.shutdown()
        atexit.unregister(self.shutdown)

    async def _close(self) -> None:
        self._watch_task.cancel()
        self.tokenizer_manager.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
        self.shutdown()


class ControlResult(TypedDict):
    """What a control call answers (SGLang's shape): whether it was done, and why not."""

    success: bool
    message: str


def _chunk(item: GenerateOutput | list[GenerateOutput]) -> GenerateOutput:
    """A streamed item: TokenizerManager.generate streams one chunk at a time (a batch's chunks
    carry their `index`), never a list."""
    return cast(GenerateOutput, item)
