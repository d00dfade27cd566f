"""run_batch: many runs of one program on a thread pool, after sending the program's traced
constant prefix once so every program of the batch hits the radix cache."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from radixgen.lang.adapter_scope import using_adapter
from radixgen.lang.global_config import global_config
from radixgen.lang.interpreter import ProgramState, resolve_backend, run_program
from radixgen.lang.ir import SglSamplingParams
from radixgen.lang.run_trace import TraceScope, tagged
from radixgen.lang.tracer import extract_prefix_by_tracing

if TYPE_CHECKING:
    from radixgen.lang.function import SglFunction

logger = logging.getLogger(__name__)
T = TypeVar("T")
MIN_PRECACHE_CHARS = 64  # shorter constant prefixes are not worth a request (SGLang's rule)


def cache_program(program: SglFunction, backend: object) -> str:
    """Prefill the program's constant prefix (found by tracing) once; returns the prefix."""
    backend = resolve_backend(backend)
    prefix = extract_prefix_by_tracing(program, backend)
    if len(prefix) > MIN_PRECACHE_CHARS:
        backend.cache_prefix(prefix)
    return prefix


def _worker_count(num_threads: int | str, batch: int) -> int:
    if num_threads == "auto":
        num_threads = max(96, (os.cpu_count() or 1) * 16)
    return max(1, min(int(num_threads), batch))


def run_program_batch(
    program: SglFunction,
    backend: object,
    batch_arguments: list[dict[str, object]],
    default_sampling_para: SglSamplingParams,
    num_threads: int | str,
    progress_bar: bool,
    generator_style: bool = False,
    trace: bool = False,
) -> list[ProgramState] | Iterator[ProgramState]:
    """Run the program once per argument dict; a failing program keeps its error in
    `state.error()` (logged) instead of failing the batch, as SGLang's run_batch does. Traced,
    the batch is one trace: its prefix prefill at `#0`, program i under `item<i>`."""
    backend = resolve_backend(backend)
    scope = TraceScope.new(program.__name__) if trace else None
    if global_config.enable_precache_with_tracing and len(batch_arguments) > 1:
        with (
            tagged(scope.tag(0, 0, "prefill", "batch prefix") if scope else None),
            using_adapter(default_sampling_para.lora_path),  # the prefix is cached per adapter
        ):
            cache_program(program, backend)
    workers = _worker_count(num_threads, len(batch_arguments))

    def run_one(item: tuple[int, dict[str, object]]) -> ProgramState:
        i, arguments = item
        state = run_program(
            program, backend, (), arguments, default_sampling_para, False, raise_errors=False,
            trace=scope.item(i) if scope is not None else None,
        )  # fmt: skip
        if state.stream_executor.error_ is not None:
            logger.warning("a program of the batch failed: %s", state.stream_executor.error_)
        return state

    iterator = _run_in_pool(run_one, list(enumerate(batch_arguments)), workers, progress_bar)
    return iterator if generator_style else list(iterator)


def _run_in_pool(
    fn: Callable[[T], ProgramState],
    items: list[T],
    workers: int,
    progress_bar: bool,
    chunk: int = 200,
) -> Iterator[ProgramState]:
    """Results in input order; submitted in chunks so a generator yields before the end."""
    bar = None
    if progress_bar:
        import tqdm  # only here: `import radixgen` would otherwise load it (~60 ms)

        bar = tqdm.tqdm(total=len(items))
    try:
        with ThreadPoolExecutor(workers) as pool:
            for start in range(0, len(items), chunk):
                futures: list[Future[ProgramState]] = []
                for arguments in items[start : start + chunk]:
                    future = pool.submit(fn, arguments)
                    if bar is not None:
                        future.add_done_callback(lambda _: bar.update())
                    futures.append(future)
                for future in futures:
                    yield future.result()
    finally:
        if bar is not None:
            bar.close()
