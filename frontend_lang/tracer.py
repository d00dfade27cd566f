"""Tracing: run a program on placeholder arguments to record its IR without calling a model.

`function.trace()` returns the recorded program (`TracerProgramState`: `.nodes`, `print()`);
`extract_prefix_by_tracing` stops at the first node whose text is not known in advance, which is
the constant prefix `run_batch` prefills once for the whole batch.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from radixgen.lang.chat_template import ChatTemplate, get_chat_template
from radixgen.lang.ir import (
    RoleMethods,
    SglArgument,
    SglConstantText,
    SglExpr,
    SglExprList,
    SglFork,
    SglGen,
    SglGetForkItem,
    SglRoleBegin,
    SglRoleEnd,
    SglSelect,
    SglVariable,
    SglVarScopeBegin,
    SglVarScopeEnd,
    as_expr,
)

if TYPE_CHECKING:
    from radixgen.lang.backend.base import BaseBackend
    from radixgen.lang.function import SglFunction


class StopTracing(Exception):
    """The constant prefix ended; tracing for a prefix stops here."""


_scope = threading.local()


def current_tracer() -> TracerProgramState | None:
    return getattr(_scope, "tracer", None)


@contextmanager
def tracing_scope(tracer: TracerProgramState) -> Iterator[None]:
    previous = current_tracer()
    _scope.tracer = tracer
    try:
        yield
    finally:
        _scope.tracer = previous


class TracerProgramState(RoleMethods):
    """Stands in for `ProgramState` while tracing; records nodes instead of executing them."""

    def __init__(
        self, chat_template: ChatTemplate, arguments: dict[str, object], only_trace_prefix: bool
    ) -> None:
        self.pid = uuid.uuid4().hex
        self.chat_template = chat_template
        self.arguments = arguments
        self.only_trace_prefix = only_trace_prefix
        self.nodes: list[SglExpr] = []
        self.last_node: SglExpr | None = None
        self.variables: dict[str, SglVariable] = {}
        self.messages_: list[dict[str, Any]] = []
        self.cur_role: str | None = None
        self.child_states: list[TracerProgramState] = []
        self.ret_value: Any = None

    # --- the ProgramState surface programs use ----------------------------------------------

    def __iadd__(self, other: object) -> TracerProgramState:
        self._execute(as_expr(other))
        return self

    def _append_expr(self, expr: SglExpr) -> None:
        self._execute(expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        self._execute(SglVarScopeBegin(name))
        yield
        self._execute(SglVarScopeEnd(name))

    def fork(self, size: int = 1, position_ids_offset: object = None) -> TracerStateGroup:
        if self.only_trace_prefix:
            raise StopTracing()
        fork = SglFork(size)
        fork.prev_node = self.last_node
        children = []
        for i in range(size):
            child = TracerProgramState(self.chat_template, self.arguments, False)
            item = SglGetForkItem(i)
            item.prev_node = fork
            child.last_node = item
            child.variables = dict(self.variables)
            child.messages_ = list(self.messages_)
            child.cur_role = self.cur_role
            children.append(child)
        self.child_states.extend(children)
        return TracerStateGroup(children, self)

    def __getitem__(self, name: str) -> Any:
        if name in self.arguments and not isinstance(self.arguments[name], SglArgument):
            return self.arguments[name]
        if self.only_trace_prefix or name not in self.variables:
            raise StopTracing()
        return SglVariable(name, self.variables[name].source)

    get_var = __getitem__

    # --- recording --------------------------------------------------------------------------

    def _append(self, node: SglExpr) -> None:
        node.prev_node = self.last_node
        self.nodes.append(node)
        self.last_node = node

    def _execute(self, node: SglExpr) -> None:
        if isinstance(node, SglExprList):
            for child in node.expr_list:
                self._execute(child)
        elif isinstance(node, SglConstantText):
            self._append(node)
        elif isinstance(node, (SglGen, SglSelect)):
            name = node.name or f"{type(node).__name__.lower()}_{len(self.variables)}"
            self.variables[name] = SglVariable(name, node)
            self._append(node)
        elif isinstance(node, SglRoleBegin):
            if self.cur_role is not None:
                raise ValueError("roles cannot nest")
            if not self.messages_ and node.role != "system":
                default = self.chat_template.default_system_prompt
                if default:
                    self._execute(SglRoleBegin("system"))
                    self._append(SglConstantText(default))
                    self._execute(SglRoleEnd("system"))
            self.cur_role = node.role
            prefix, _ = self.chat_template.get_prefix_and_suffix(node.role, self.messages_)
            self._append(SglConstantText(prefix))
        elif isinstance(node, SglRoleEnd):
            _, suffix = self.chat_template.get_prefix_and_suffix(node.role, self.messages_)
            self._append(SglConstantText(suffix))
            self.messages_.append({"role": node.role, "content": ""})
            self.cur_role = None
        elif isinstance(node, SglVarScopeEnd):
            self.variables[node.name] = SglVariable(node.name, self.last_node)
            self._append(node)
        elif self.only_trace_prefix and not isinstance(node, SglVarScopeBegin):
            raise StopTracing()
        else:
            self._append(node)

    def flatten_nodes(self) -> list[SglExpr]:
        return list(self.nodes)

    def constant_prefix(self) -> str:
        """The text every run of the program starts with."""
        prefix = ""
        for node in self.nodes:
            if isinstance(node, SglVarScopeBegin):
                continue
            if not isinstance(node, SglConstantText):
                break
            prefix += node.value
        return prefix

    def print(self) -> str:
        """One line per node, `%id = %prev + node` (SGLang's graph dump), forks included."""
        lines = []
        for node in self.nodes:
            prev = f"%{node.prev_node.node_id} + " if node.prev_node is not None else ""
            lines.append(f"%{node.node_id} = {prev}{node!r}")
        for child in self.child_states:
            lines.extend("  " + line for line in child.print().splitlines())
        return "\n".join(lines)

    __str__ = print


class TracerStateGroup:
    def __init__(self, states: list[TracerProgramState], src: TracerProgramState) -> None:
        self.states = states
        self.src = src

    def __getitem__(self, i: int) -> TracerProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: TracerProgramState) -> None:
        pass

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[TracerProgramState]:
        return iter(self.states)

    def __iadd__(self, other: object) -> TracerStateGroup:
        for i, state in enumerate(self.states):
            if isinstance(other, (list, tuple)):
                state += other[i]
            elif callable(other) and not isinstance(other, SglExpr):
                state += other(i)
            else:
                state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        for child in self.states:
            for name, var in child.variables.items():
                self.src.variables.setdefault(name, var)


def _template_of(backend: BaseBackend | None) -> ChatTemplate:
    if backend is not None and hasattr(backend, "get_chat_template"):
        template: ChatTemplate = backend.get_chat_template()
        return template
    return get_chat_template("default")


def trace_program(
    program: SglFunction, arguments: dict[str, object], backend: BaseBackend | None
) -> TracerProgramState:
    """The whole program's IR; arguments not given are placeholders."""
    args: dict[str, object] = {
        name: SglArgument(name) for name in program.arg_names if name not in arguments
    }
    args.update(arguments)
    args.update(program.bind_arguments)
    tracer = TracerProgramState(_template_of(backend), args, only_trace_prefix=False)
    with tracing_scope(tracer):
        tracer.ret_value = program.func(tracer, **args)
    return tracer


def extract_prefix_by_tracing(program: SglFunction, backend: BaseBackend | None) -> str:
    """The constant text at the start of every run (empty when the program starts variably)."""
    args: dict[str, object] = {name: SglArgument(name) for name in program.arg_names}
    args.update(program.bind_arguments)
    tracer = TracerProgramState(_template_of(backend), args, only_trace_prefix=True)
    try:
        with tracing_scope(tracer):
            program.func(tracer, **args)
    except Exception:  # StopTracing, or code that needs a real value (len(arg), arg.split())
        pass
    return tracer.constant_prefix()
