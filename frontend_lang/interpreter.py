"""Running programs: `ProgramState` (the `s` a program receives), fork groups, run and run_batch.

`run` calls the program function in the caller's thread while each state's StreamExecutor talks
to the backend on its own worker (batch.py runs many programs).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from radixgen.lang.backend.base import BaseBackend
from radixgen.lang.backend.engine import EngineBackend
from radixgen.lang.executor import STREAMED_LOGPROB_KEYS, StreamExecutor, program_site
from radixgen.lang.global_config import global_config
from radixgen.lang.ir import (
    RoleMethods,
    SglConcateAndAppend,
    SglExpr,
    SglSamplingParams,
    SglVarScopeBegin,
    SglVarScopeEnd,
)
from radixgen.lang.run_trace import TraceScope

if TYPE_CHECKING:
    from radixgen.lang.function import SglFunction
    from radixgen.runtime.entrypoints.engine import Engine


def resolve_backend(backend: object) -> BaseBackend:
    """The backend to use: the given one or the default; a runtime Engine is wrapped. Read by
    its shape, as SGLang does (a Runtime has `endpoint`, an Engine `tokenizer_manager`)."""
    backend = backend if backend is not None else global_config.default_backend
    if backend is None:
        raise ValueError("no backend: call set_default_backend(...) or pass backend=...")
    if hasattr(backend, "endpoint"):  # SGLang's Runtime wrapper shape
        backend = backend.endpoint
    if hasattr(backend, "tokenizer_manager") and not hasattr(backend, "get_chat_template"):
        backend = EngineBackend.wrap(cast("Engine", backend))
    return cast(BaseBackend, backend)


class ProgramState(RoleMethods):
    """What a program function receives as `s`: append with `+=`, read with `s["name"]`."""

    def __init__(self, stream_executor: StreamExecutor) -> None:
        self.stream_executor = stream_executor
        self.ret_value: Any = None

    def __iadd__(self, other: object) -> ProgramState:
        if other is None:
            raise ValueError("tried to append None to a program state")
        self.stream_executor.submit(other, program_site())
        return self

    def _append_expr(self, expr: object) -> None:
        self.stream_executor.submit(expr, program_site())

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block becomes variable `name`."""
        self.stream_executor.submit(SglVarScopeBegin(name), program_site())
        yield
        self.stream_executor.submit(SglVarScopeEnd(name), program_site())

    def fork(self, size: int = 1, position_ids_offset: object = None) -> ProgramStateGroup:
        children = self.stream_executor.fork(size)
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    @contextmanager
    def copy(self, position_ids_offset: object = None) -> Iterator[ProgramState]:
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    def text(self) -> str:
        self.stream_executor.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, Any]]:
        self.stream_executor.sync()
        return self.stream_executor.messages_

    def sync(self) -> None:
        self.stream_executor.sync()

    @property
    def trace_id(self) -> str | None:
        """The run's program-trace id (`run(..., trace=True)`; /dashboard/api/traces/<id>)."""
        trace = self.stream_executor.trace
        return trace.trace_id if trace is not None else None

    def error(self) -> BaseException | None:
        self.stream_executor.sync()
        return self.stream_executor.error_

    def get_var(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: object) -> None:
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        return self.stream_executor.get_meta_info(name)

    def parsed(self, name: str) -> Any:
        """The variable as a Python value: int/float/bool for dtype gens, the pydantic instance
        (or dict) for json_schema gens, the text otherwise; lists stay lists."""
        value = self.get_var(name)
        parse = self.stream_executor.parsers.get(name, str)
        try:
            return [parse(v) for v in value] if isinstance(value, list) else parse(value)
        except ValueError as e:
            raise ValueError(f"variable {name!r} does not parse: {e}; text: {value!r}") from e

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: object) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self.stream_executor.variables

    def __del__(self) -> None:
        executor = getattr(self, "stream_executor", None)
        if executor is not None:
            executor.end()

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"

    # --- streaming --------------------------------------------------------------------------

    def _wait_change(self, seen: int) -> int:
        exe = self.stream_executor
        with exe.changed:
            exe.changed.wait_for(lambda: exe.version != seen or exe.is_finished, timeout=1.0)
            return exe.version

    def _stream_deltas(self, var_name: str | None) -> Iterator[tuple[str, Any, bool]]:
        """(new text, meta_info, done) each time the text (or the variable) grows."""
        exe, seen, pos = self.stream_executor, -1, 0
        while True:
            seen = self._wait_change(seen)
            with exe.changed:  # text and meta_info of the same chunk (see _execute_gen)
                finished = exe.is_finished
                if var_name is None:
                    current, done = exe.text_, finished
                else:
                    event = exe.variable_event.get(var_name)
                    done = finished or (event is not None and event.is_set())
                    current = exe.variables.get(var_name, "")
                    current = current if isinstance(current, str) else ""
                meta = exe.meta_info.get(var_name) if var_name else None
            yield current[pos:], meta, done
            pos = len(current)
            if done:  # a failure ends the stream quietly, as in SGLang; state.error() holds it
                return

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text deltas while streaming (the whole text or one variable); one item otherwise."""
        if not self.stream_executor.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        for delta, _, _ in self._stream_deltas(var_name):
            if delta:
                yield delta

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """Async text_iter; with return_meta_data, (delta, meta_info) whose logprobs are the
        tokens since the previous item."""
        if not self.stream_executor.stream:
            value = self.text() if var_name is None else self.get_var(var_name)
            yield (value, self.get_meta_info(var_name)) if return_meta_data and var_name else value
            return
        deltas = self._stream_deltas(var_name)
        sent = dict.fromkeys(STREAMED_LOGPROB_KEYS, 0)
        while True:
            item = await asyncio.to_thread(next, deltas, None)
            if item is None:
                return
            delta, meta, _ = item
            if not delta:
                continue  # its tokens' entries go with the next item that has text
            if return_meta_data:
                meta = dict(meta or {})
                for key in STREAMED_LOGPROB_KEYS:
                    if key in meta:
                        entries = meta[key] or []
                        meta[key] = entries[sent[key] :]
                        sent[key] = len(entries)
                yield delta, meta
            else:
                yield delta


class ProgramStateGroup:
    """The branches of `s.fork(n)`: append to all with `+=`, then `join()` back into `s`."""

    def __init__(self, states: list[ProgramState], src_state: ProgramState) -> None:
        self.states = states
        self.src_state = src_state

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each new child variable becomes a list in the parent (branch order);
        concate_and_append: each child's new text is appended to the parent's text. A failed
        branch's error becomes the parent's `error()` (join itself does not raise).

        As in SGLang, a variable the parent already has when `join` runs (set before or after the
        fork, or by an earlier join) keeps the parent's value."""
        if mode == "gather_variable":
            src = self.src_state.stream_executor
            src.sync()
            base_vars = set(src.variables)
            for child in self.states:
                exe = child.stream_executor
                exe.sync()
                if exe.error_ is not None:
                    src.adopt_error(exe.error_)  # SGLang's join does not raise; error() tells
                for name in exe.variables.keys() - base_vars:
                    src.variables.setdefault(name, []).append(exe.variables[name])
                    if name in exe.parsers:
                        src.parsers[name] = exe.parsers[name]
        elif mode == "concate_and_append":
            self.src_state += SglConcateAndAppend(self.states)
            self.src_state.stream_executor.sync()
        else:
            raise ValueError(f"unknown join mode {mode!r}: gather_variable or concate_and_append")
        for child in self.states:
            child.stream_executor.end()

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        if self.states[i] is not value:  # `forks[i] += x` assigns the same state back
            raise TypeError("fork branches cannot be replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: object) -> ProgramStateGroup:
        if callable(other) and not isinstance(other, SglExpr):
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} expressions for {len(self.states)} branches")
            for state, expr in zip(self.states, other, strict=True):
                state += expr
        else:
            for state in self.states:
                state += other
        return self


# --- running ---------------------------------------------------------------------------------


def _run_body(
    state: ProgramState,
    program: SglFunction,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    stream: bool,
) -> None:
    exe = state.stream_executor
    try:
        state.ret_value = program.func(state, *args, **kwargs)
    except BaseException as e:
        if exe.error_ is None:
            exe.error_ = e
        if not stream:
            raise
    finally:
        exe.end()
    if global_config.verbosity >= 2:
        print(state.text())


def run_program(
    program: SglFunction,
    backend: object,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    default_sampling_para: SglSamplingParams,
    stream: bool,
    use_thread: bool = True,
    raise_errors: bool = True,
    trace: TraceScope | None = None,
) -> ProgramState:
    """Run one program; without streaming, return once all its statements are done.

    SGLang's semantics: a statement that fails (the backend refused it, say) does not raise here:
    the returned state's `error()` holds it and its text so far is kept. An exception raised by
    the program's own code propagates (`raise_errors`), as SGLang's run() lets it; with
    `raise_errors=False` (run_batch) it is kept in `error()` too. With a `trace` scope every
    request the run sends carries its place in the run's tree (run_trace.py)."""
    backend = resolve_backend(backend)
    kwargs = {**kwargs, **program.bind_arguments}
    exe = StreamExecutor(backend, kwargs, default_sampling_para, None, stream, use_thread, trace)
    state = ProgramState(exe)
    if stream:
        threading.Thread(
            target=_run_body, args=(state, program, args, kwargs, True), daemon=True
        ).start()
        return state
    try:
        _run_body(state, program, args, kwargs, False)
    except BaseException:
        if raise_errors:
            raise
    exe.sync()
    return state
