"""StreamExecutor: runs one program state's expressions in order on its own worker thread.

`s += expr` only queues; the worker calls the backend, appends text and sets variables, so a
program (and each fork) overlaps its model calls with the caller's Python. A failure stops the
worker, wakes every waiter and is kept, naming the program line that queued the expression, as
the state's `error()` (SGLang's semantics: later statements are dropped, the text so far stays);
reading a variable the failure left unset raises it, so nothing waits forever on a dead worker.
"""

from __future__ import annotations

import contextvars
import linecache
import logging
import os
import queue
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from radixgen.lang import constraints
from radixgen.lang.adapter_scope import using_adapter
from radixgen.lang.choices import token_length_normalized
from radixgen.lang.errors import ProgramError
from radixgen.lang.global_config import global_config
from radixgen.lang.ir import (
    SglCommitLazy,
    SglConcateAndAppend,
    SglConstantText,
    SglExpr,
    SglExprList,
    SglGen,
    SglRoleBegin,
    SglRoleEnd,
    SglSamplingParams,
    SglSelect,
    SglSeparateReasoning,
    SglVariable,
    SglVarScopeBegin,
    SglVarScopeEnd,
    as_expr,
)
from radixgen.lang.run_trace import TraceScope, call_label, tagged
from radixgen.reasoning_parser import ReasoningParser

if TYPE_CHECKING:
    from radixgen.lang.backend.base import BaseBackend
    from radixgen.lang.chat_template import ChatTemplate

logger = logging.getLogger(__name__)
# fork(n) prefills the shared text only when at least this much of it is new to the server: text
# a gen or select just sent (prompt and output) is in the radix cache already
FORK_PRECACHE_MIN_CHARS = 64
# meta_info lists a streaming server sends per chunk (each chunk's own tokens); a streamed gen's
# meta_info holds them accumulated, as a non-streamed gen's does
STREAMED_LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def program_site() -> str | None:
    """'File "f.py", line 12, in prog: s += gen(...)' for the first frame outside this package."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    site = f'File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}'
    return f"{site}: {line}" if line else site


class StreamExecutor:
    """The state behind a `ProgramState`: text, chat messages, variables and the worker thread."""

    def __init__(
        self,
        backend: BaseBackend,
        arguments: dict[str, object],
        default_sampling_para: SglSamplingParams,
        chat_template: ChatTemplate | None,
        stream: bool,
        use_thread: bool = True,
        trace: TraceScope | None = None,
    ) -> None:
        self.sid = uuid.uuid4().hex
        self.trace = trace  # run(trace=True): this state's place in the run's tree
        self.statement = -1  # index of the statement executing (forks take one too)
        self._calls = 0  # backend calls made by that statement so far
        self.backend = backend
        self.arguments = arguments
        self.default_sampling_para = default_sampling_para
        self.stream = stream
        self.variables: dict[str, Any] = {}
        self.variable_event: dict[str, threading.Event] = {}
        self.meta_info: dict[str, Any] = {}
        self.parsers: dict[str, Callable[[str], object]] = {}
        self.text_ = ""
        self.messages_: list[dict[str, Any]] = []
        self.chat_template = chat_template or backend.get_chat_template()
        self.cur_role: str | None = None
        self.cur_role_begin_pos: int | None = None
        self.fork_start_text_pos: int | None = None
        self.server_seen = 0  # length of text_ the backend has already processed (and cached)
        self.error_: BaseException | None = None
        self.is_finished = False
        # bumped and notified on every text/variable change; streaming readers wait on it
        self.changed = threading.Condition()
        self.version = 0
        self._submit_lock = threading.Lock()
        self._dead = False
        self.use_thread = use_thread
        if use_thread:
            # a statement and its program site; None stops the worker
            self.queue: queue.Queue[tuple[SglExpr, str | None] | None] = queue.Queue()
            ctx = contextvars.copy_context()
            self.worker = threading.Thread(
                target=ctx.run, args=(self._worker_loop,), daemon=True, name="radixgen-program"
            )
            self.worker.start()

    # --- called from the program's thread ---------------------------------------------------

    def submit(self, expr: object, site: str | None = None) -> None:
        """Queue `expr`; after a failure it is dropped (the failure stays in `error_`), except
        without a worker thread, where the statement runs inline and its failure raises, as in
        SGLang."""
        expr = as_expr(expr)
        with self._submit_lock:
            if self.error_ is not None:
                if not self.use_thread:
                    raise self.error_
                return
            self._init_var_event(expr)
            if self.use_thread and not self._dead:
                self.queue.put((expr, site))
                return
        self.sync()  # after end() (a joined fork, say): run inline once the worker has drained
        self._execute_guarded(expr, site)
        if self.error_ is not None and not self.use_thread:
            raise self.error_

    def sync(self) -> None:
        if self.use_thread:
            self.queue.join()

    def end(self) -> None:
        """No more expressions will come: let the worker exit once the queue is done."""
        if self.use_thread:
            with self._submit_lock:
                if not self._dead:
                    self._dead = True
                    self.queue.put(None)
        self.backend.end_program(self)

    def get_var(self, name: str) -> Any:
        if name in self.variable_event:
            self.variable_event[name].wait()
        if name not in self.variables:
            if self.error_ is not None:
                raise self.error_
            raise KeyError(f"program variable {name!r} was never set")
        return self.variables[name]

    def set_var(self, name: str, value: object) -> None:
        self.variables[name] = value
        self._notify()

    def get_meta_info(self, name: str, timeout: float | None = None) -> Any:
        if name in self.variable_event and not self.variable_event[name].wait(timeout):
            raise TimeoutError(f"timed out waiting for variable {name!r}")
        return self.meta_info.get(name)

    def adopt_error(self, error: BaseException) -> None:
        """Record a failure found outside the worker (a joined fork's): later statements drop."""
        with self._submit_lock:
            if self.error_ is None:
                self.error_ = error
        for event in self.variable_event.values():
            event.set()
        self._notify()

    def fork(self, size: int = 1) -> list[StreamExecutor]:
        """Branches that start from this state's text; a failed state's branches carry its
        error (their statements are dropped, as the parent's are)."""
        size = int(size)
        if size < 1:
            raise ValueError(f"fork needs at least one branch, got {size}")
        if size > 1 and global_config.enable_fork_precache:
            self.submit(SglCommitLazy(), program_site())  # the worker may not have the text yet
        self.sync()
        self.statement += 1  # NOTE: the worker is idle now (synced): the fork is a statement
        children = []
        for i in range(size):
            scope = self.trace.branch(self.statement, i) if self.trace is not None else None
            child = StreamExecutor(
                self.backend, self.arguments, self.default_sampling_para, self.chat_template,
                self.stream, self.use_thread, scope,
            )  # fmt: skip
            child.variables = dict(self.variables)
            child.parsers = dict(self.parsers)
            child.text_ = self.text_
            child.messages_ = list(self.messages_)
            child.cur_role = self.cur_role
            child.cur_role_begin_pos = self.cur_role_begin_pos
            child.fork_start_text_pos = len(self.text_)
            child.server_seen = self.server_seen
            if self.error_ is not None:
                child.adopt_error(self.error_)
            children.append(child)
        return children

    # --- the worker ------------------------------------------------------------------------

    def _worker_loop(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                self.queue.task_done()
                break
            expr, site = item
            failed = not self._execute_guarded(expr, site)
            self.queue.task_done()
            if failed:
                with self._submit_lock:
                    self._dead = True
                    while True:  # nothing can be queued now: release every waiter of sync()
                        try:
                            self.queue.get_nowait()
                        except queue.Empty:
                            break
                        self.queue.task_done()
                break
        self._finish()

    def _execute_guarded(self, expr: SglExpr, site: str | None) -> bool:
        self.statement += 1
        self._calls = 0
        try:
            self._execute(expr)
            return True
        except Exception as e:
            what = f"{type(e).__name__}: {e}"
            error = ProgramError(f"{_describe(expr)} failed: {what}", site)
            error.__cause__ = e
            logger.debug("program statement failed", exc_info=error)
            self.error_ = error
            for event in self.variable_event.values():
                event.set()
            if not self.use_thread:
                self._finish()
            return False

    def _finish(self) -> None:
        self.is_finished = True
        self._notify()

    def _notify(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def _init_var_event(self, expr: SglExpr) -> None:
        if isinstance(expr, (SglGen, SglSelect, SglVarScopeBegin)) and expr.name is not None:
            self.variable_event.setdefault(expr.name, threading.Event()).clear()
        elif isinstance(expr, SglSeparateReasoning):
            for name in expr.names:
                self.variable_event.setdefault(name, threading.Event()).clear()
        elif isinstance(expr, SglExprList):
            for e in expr.expr_list:
                self._init_var_event(e)

    def _set_result(self, name: str | None, value: Any, meta: Any) -> None:
        if name is None:
            return
        with self.changed:
            self.variables[name] = value
            self.meta_info[name] = meta
            if name in self.variable_event:
                self.variable_event[name].set()
            self._notify()

    # --- expressions -----------------------------------------------------------------------

    def _execute(self, expr: SglExpr) -> None:
        if isinstance(expr, SglConstantText):
            self._fill(expr.value)
        elif isinstance(expr, SglExprList):
            for e in expr.expr_list:
                self._execute(e)
        elif isinstance(expr, SglGen):
            self._execute_gen(expr)
        elif isinstance(expr, SglSelect):
            with self._backend_call("select", expr.name, lora_path=expr.lora_path):
                decision = self.backend.select(
                    self, expr.choices, expr.temperature, expr.choices_method
                )
            self._fill(decision.decision)
            self.server_seen = len(self.text_)
            self._set_result(expr.name, decision.decision, decision.meta_info)
        elif isinstance(expr, SglRoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, SglRoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, SglVarScopeBegin):
            self.variables[expr.name] = len(self.text_)
        elif isinstance(expr, SglVarScopeEnd):
            self._set_result(expr.name, self.text_[self.variables[expr.name] :], None)
        elif isinstance(expr, SglVariable):
            self._fill(str(self.get_var(expr.name)))
        elif isinstance(expr, SglCommitLazy):
            if len(self.text_) - self.server_seen >= FORK_PRECACHE_MIN_CHARS:
                with self._backend_call("prefill", None, "fork prefix"):
                    self.backend.commit_lazy_operations(self)
                self.server_seen = len(self.text_)
        elif isinstance(expr, SglSeparateReasoning):
            self._separate_reasoning(expr)
        elif isinstance(expr, SglConcateAndAppend):
            for state in expr.states:
                child = state.stream_executor
                child.sync()
                if child.error_ is not None:
                    raise child.error_
                self._fill(child.text_[child.fork_start_text_pos :])
        else:
            raise TypeError(f"cannot execute {expr!r}")

    @contextmanager
    def _backend_call(
        self, kind: str, name: str | None, label: str | None = None, lora_path: str | None = None
    ) -> Iterator[None]:
        """Around one backend call: its requests carry their place in a traced run and run
        under `lora_path` (None: the run's adapter, if any)."""
        tag = None
        if self.trace is not None:
            tag = self.trace.tag(self.statement, self._calls, kind, label or call_label(kind, name))
            self._calls += 1
        adapter = lora_path if lora_path is not None else self.default_sampling_para.lora_path
        with tagged(tag), using_adapter(adapter):
            yield

    def _separate_reasoning(self, expr: SglSeparateReasoning) -> None:
        """Split each named gen's reply; the reasoning leaves the program text when the reply is
        still its end (so later gens do not see it, as in SGLang)."""
        parser = ReasoningParser(expr.model_type)
        for expr_name, var in zip(_named_outputs(expr.expr), expr.names, strict=True):
            text = self.variables.get(expr_name)
            if not isinstance(text, str):
                raise ValueError(f"separate_reasoning: {expr_name!r} holds no generated text")
            reasoning, answer = parser.parse(text)
            if self.text_.endswith(text):
                self.text_ = self.text_[: len(self.text_) - len(text)] + answer
                self.server_seen = min(self.server_seen, len(self.text_))
            self.variables[expr_name] = answer
            self._set_result(var, reasoning or "", self.meta_info.get(expr_name))

    def _fill(self, text: str) -> None:
        self.text_ += text
        self._notify()

    def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(f"roles cannot nest: {role!r} begins inside {self.cur_role!r}")
        if not self.messages_ and role != "system" and self.chat_template.default_system_prompt:
            self._role_begin("system")
            self._fill(self.chat_template.default_system_prompt)
            self._role_end("system")
        self.cur_role = role
        prefix, _ = self.chat_template.get_prefix_and_suffix(role, self.messages_)
        self._fill(prefix)
        self.cur_role_begin_pos = len(self.text_)

    def _role_end(self, role: str) -> None:
        content = self.text_[self.cur_role_begin_pos :].lstrip()
        self.cur_role = None
        _, suffix = self.chat_template.get_prefix_and_suffix(role, self.messages_)
        self._fill(suffix)
        self.messages_.append({"role": role, "content": content})

    def resolve_sampling_params(self, expr: SglGen) -> SglSamplingParams:
        """Run-level defaults overridden by the gen's own values, plus the template's stop."""
        params = self.default_sampling_para.merged(expr.sampling_params)
        params.stop = params.stop_list() + list(self.chat_template.stop_str)
        if params.dtype is not None:
            regex, stops = constraints.dtype_regex(params.dtype)
            if params.regex is not None:
                logger.warning("gen(%r): both dtype and regex are set; dtype wins", expr.name)
            params.regex = regex
            params.stop = params.stop + stops
        return params

    def _execute_gen(self, expr: SglGen) -> None:
        params = self.resolve_sampling_params(expr)
        kind = "select" if params.choices is not None else "gen"
        with self._backend_call(kind, expr.name, lora_path=params.lora_path):
            self._run_gen(expr, params)

    def _run_gen(self, expr: SglGen, params: SglSamplingParams) -> None:
        if expr.name is not None and expr.parser is not None:
            self.parsers[expr.name] = expr.parser
        constrained = global_config.enable_constrained_decoding
        if params.choices is not None and not constrained:
            # without a grammar, a choice is picked by scoring, as SGLang's gen(choices=) does
            decision = self.backend.select(self, params.choices, 0.0, token_length_normalized)
            self._fill(decision.decision)
            self.server_seen = len(self.text_)
            self._set_result(expr.name, decision.decision, decision.meta_info)
            return
        if params.dtype is not None and not constrained:
            self._gen_with_retries(expr.name, params)
            return
        if not self.stream:
            comp, meta = self.backend.generate(self, params)
            self._fill(comp[0] if isinstance(comp, list) else comp)
            self.server_seen = len(self.text_)
            self._set_result(expr.name, comp, meta)
            return
        name = expr.name
        if name is not None:
            self.variables[name] = ""
        so_far: dict[str, list[Any]] = {key: [] for key in STREAMED_LOGPROB_KEYS}
        for delta, meta in self.backend.generate_stream(self, params):
            if meta:
                meta = dict(meta)
                for key, entries in so_far.items():
                    if key in meta:  # the server sends each chunk's own entries
                        entries.extend(meta[key] or [])
                        meta[key] = list(entries)
            # NOTE: text and meta change together, under the lock streaming readers take, so a
            # reader never sees a chunk's text without its logprobs (or the reverse)
            with self.changed:
                self.text_ += delta
                if name is not None:
                    self.variables[name] += delta
                    self.meta_info[name] = meta
                self._notify()
        self.server_seen = len(self.text_)
        if name is not None:
            self._set_result(name, self.variables[name], self.meta_info.get(name))

    def _gen_with_retries(self, name: str | None, params: SglSamplingParams) -> None:
        """Constrained decoding off: generate free text until it parses as the dtype."""
        regex, params.regex = params.regex, None
        seen: list[str] = []
        for attempt in range(global_config.max_parse_retries):
            comp, meta = self.backend.generate(self, params)
            text = comp[0] if isinstance(comp, list) else comp
            if regex is not None and constraints.matches(regex, text):
                self._fill(text)
                self.server_seen = len(self.text_)
                self._set_result(name, comp, {**(meta or {}), "attempts": attempt + 1})
                return
            seen.append(text)
            params.temperature = max(params.temperature or 0.0, 0.7)  # greedy would repeat
        raise ValueError(
            f"no output matched dtype {constraints.dtype_name(params.dtype)} after "
            f"{len(seen)} tries (constrained decoding is off): {seen!r}"
        )


def _named_outputs(expr: SglExpr | None) -> list[str]:
    if isinstance(expr, (SglGen, SglSelect)) and expr.name is not None:
        return [expr.name]
    if isinstance(expr, SglExprList):
        return [n for e in expr.expr_list for n in _named_outputs(e)]
    return []


def _describe(expr: SglExpr) -> str:
    if isinstance(expr, SglExprList):
        inner = [e for e in expr.expr_list if isinstance(e, (SglGen, SglSelect))]
        return _describe(inner[0]) if inner else "appending text"
    if isinstance(expr, SglGen):
        return f"gen({expr.name!r})"
    if isinstance(expr, SglSelect):
        return f"select({expr.name!r})"
    if isinstance(expr, SglCommitLazy):
        return "fork's prefix prefill"
    return type(expr).__name__
