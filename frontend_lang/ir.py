"""The intermediate representation: what `s += ...` appends, as nodes the interpreter executes and
the tracer records. Names follow SGLang's `lang/ir.py` so programs and readers map one to one.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    from radixgen.lang.choices import ChoicesSamplingMethod

_node_ids = itertools.count()

# sampling fields a gen() may override; None means "inherit the run()-level default"
SAMPLING_FIELDS = (
    "max_new_tokens",
    "min_new_tokens",
    "n",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "dtype",
    "regex",
    "json_schema",
    "choices",
    "lora_path",
)


@dataclasses.dataclass
class SglSamplingParams:
    """Sampling parameters of one gen; run() builds the defaults, gen() the overrides (None)."""

    max_new_tokens: int | None = 128
    min_new_tokens: int | None = 0
    n: int | None = 1
    stop: str | list[str] | tuple[str, ...] | None = ()
    stop_token_ids: list[int] | tuple[int, ...] | None = ()
    stop_regex: str | list[str] | tuple[str, ...] | None = ()
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    top_k: int | None = -1  # -1 disables
    min_p: float | None = 0.0
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    ignore_eos: bool | None = False
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    # constraints: `dtype` becomes a regex in the interpreter; `json_schema` is JSON text here
    dtype: Any = None
    regex: str | None = None
    json_schema: str | None = None
    choices: list[str] | None = None
    # the LoRA adapter the call runs under (None: the base model); not a sampling parameter on
    # the wire: the backends send it as /generate's `lora_path` or OpenAI's `model`
    lora_path: str | None = None

    @classmethod
    def overrides(cls, **values: object) -> SglSamplingParams:
        """A gen()'s parameters: every field None unless given."""
        params = cls(**dict.fromkeys(SAMPLING_FIELDS))
        for key, value in values.items():
            setattr(params, key, value)
        return params

    def clone(self) -> SglSamplingParams:
        return copy.deepcopy(self)

    def merged(self, override: SglSamplingParams) -> SglSamplingParams:
        """These defaults with every non-None field of `override` applied."""
        out = self.clone()
        for key in SAMPLING_FIELDS:
            value = getattr(override, key)
            if value is not None:
                setattr(out, key, copy.deepcopy(value))
        return out

    def stop_list(self) -> list[str]:
        if not self.stop:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def to_native_dict(self) -> dict[str, Any]:
        """The `sampling_params` object of SGLang's /generate (our server and Engine share it)."""
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "min_new_tokens": self.min_new_tokens,
            "n": self.n,
            "stop": self.stop_list(),
            "stop_token_ids": list(self.stop_token_ids or []),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "ignore_eos": self.ignore_eos,
        }
        for key in ("regex", "json_schema", "choices"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.stop_regex:  # a server without it refuses it: never dropped here
            out["stop_regex"] = (
                [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex)
            )
        return out

    def logprob_options(self) -> dict[str, Any]:
        """The top-level logprob keys of /generate, only those that are set (as SGLang sends)."""
        keys = (
            "return_logprob",
            "logprob_start_len",
            "top_logprobs_num",
            "return_text_in_logprobs",
        )
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class SglExpr:
    """A node; `a + b` concatenates nodes (and plain strings) into an SglExprList."""

    def __init__(self) -> None:
        self.node_id = next(_node_ids)
        self.prev_node: SglExpr | None = None

    def __add__(self, other: object) -> SglExprList:
        return _concat(self, as_expr(other))

    def __radd__(self, other: object) -> SglExprList:
        return _concat(as_expr(other), self)


def as_expr(value: object) -> SglExpr:
    if isinstance(value, SglExpr):
        return value
    if isinstance(value, str):
        return SglConstantText(value)
    raise TypeError(f"cannot append {type(value).__name__} to a program state; use str or gen()")


def _concat(a: SglExpr, b: SglExpr) -> SglExprList:
    left = a.expr_list if isinstance(a, SglExprList) else [a]
    right = b.expr_list if isinstance(b, SglExprList) else [b]
    return SglExprList(left + right)


class SglExprList(SglExpr):
    def __init__(self, expr_list: list[SglExpr]) -> None:
        super().__init__()
        self.expr_list = expr_list

    def __repr__(self) -> str:
        return f"ExprList({self.expr_list})"


class SglConstantText(SglExpr):
    def __init__(self, value: str) -> None:
        super().__init__()
        self.value = value

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


class SglArgument(SglExpr):
    """A program argument while tracing: its value is unknown, so it ends a constant prefix."""

    def __init__(self, name: str, value: object = None) -> None:
        super().__init__()
        self.name = name
        self.value = value

    def __format__(self, spec: str) -> str:
        raise TypeError(
            f"argument {self.name!r} is used inside an f-string; the tracer cannot see through "
            "f-strings, write `s += 'text' + arg` instead"
        )

    def __repr__(self) -> str:
        return f"Argument({self.name})"


class SglGen(SglExpr):
    def __init__(self, name: str | None, sampling_params: SglSamplingParams) -> None:
        super().__init__()
        self.name = name
        self.sampling_params = sampling_params
        # turns the generated text into a typed value (dtype / json_schema); see constraints.py
        self.parser: Callable[[str], object] | None = None

    def __repr__(self) -> str:
        return f"Gen({self.name!r})"


class SglSelect(SglExpr):
    def __init__(
        self,
        name: str | None,
        choices: list[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
        lora_path: str | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.choices = choices
        self.temperature = temperature
        self.choices_method = choices_method
        self.lora_path = lora_path  # None: the run's adapter

    def __repr__(self) -> str:
        return f"Select({self.name!r}, choices={self.choices})"


class SglRoleBegin(SglExpr):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def __repr__(self) -> str:
        return f"RoleBegin({self.role})"


class SglRoleEnd(SglExpr):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def __repr__(self) -> str:
        return f"RoleEnd({self.role})"


class SglVarScopeBegin(SglExpr):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __repr__(self) -> str:
        return f"VarScopeBegin({self.name!r})"


class SglVarScopeEnd(SglExpr):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __repr__(self) -> str:
        return f"VarScopeEnd({self.name!r})"


class SglVariable(SglExpr):
    """A reference to a variable produced by `source` (what `s["x"]` is while tracing)."""

    def __init__(self, name: str, source: SglExpr | None) -> None:
        super().__init__()
        self.name = name
        self.source = source

    def __repr__(self) -> str:
        return f"Variable({self.name!r})"


class SglFork(SglExpr):
    def __init__(self, number: int) -> None:
        super().__init__()
        self.number = number

    def __repr__(self) -> str:
        return f"Fork(number={self.number})"


class SglGetForkItem(SglExpr):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def __repr__(self) -> str:
        return f"GetForkItem(index={self.index})"


class SglCommitLazy(SglExpr):
    """Prefill the state's text now (fork's cache warm-up)."""

    def __repr__(self) -> str:
        return "CommitLazy()"


class SglConcateAndAppend(SglExpr):
    """join(mode="concate_and_append"): append each child's new text to the parent."""

    def __init__(self, states: list[Any]) -> None:
        super().__init__()
        self.states = states

    def __repr__(self) -> str:
        return f"ConcateAndAppend({len(self.states)} states)"


class SglSeparateReasoning(SglExpr):
    """separate_reasoning(gen("x"), model_type): after the gen, its <think> part moves to the
    variable `x_reasoning_content` and out of `x` and the program text (SGLang's semantics)."""

    def __init__(self, model_type: str, expr: SglExpr | None) -> None:
        super().__init__()
        self.model_type = model_type
        self.expr = expr
        self.names = [reasoning_var_name(n) for n in _generated_names(expr)]
        self.name = self.names[0] if self.names else None

    def __repr__(self) -> str:
        return f"SeparateReasoning(model_type={self.model_type}, names={self.names})"


def reasoning_var_name(name: str | None) -> str:
    if not name:
        raise ValueError("separate_reasoning needs a named gen or select")
    return f"{name}_reasoning_content"


def _generated_names(expr: SglExpr | None) -> list[str | None]:
    if isinstance(expr, (SglGen, SglSelect)):
        return [expr.name]
    if isinstance(expr, SglExprList):
        return [n for e in expr.expr_list for n in _generated_names(e)]
    return []


class RoleMethods:
    """`s.system/user/assistant(expr)` and `with s.user():` for every kind of program state;
    a state says how it appends one expression (`_append_expr`)."""

    def _append_expr(self, expr: SglExpr) -> None:
        raise NotImplementedError

    def _role(
        self, name: str, expr: str | SglExpr | None = None
    ) -> SglExprList | AbstractContextManager[None]:
        if expr is not None:
            role_expr = SglExprList([SglRoleBegin(name), as_expr(expr), SglRoleEnd(name)])
            self._append_expr(role_expr)
            return role_expr

        @contextmanager
        def scope() -> Iterator[None]:
            self._append_expr(SglRoleBegin(name))
            yield
            self._append_expr(SglRoleEnd(name))

        return scope()

    # s.user("text") appends the turn and returns it; `with s.user():` wraps what is appended
    @overload
    def system(self, expr: None = None) -> AbstractContextManager[None]: ...
    @overload
    def system(self, expr: str | SglExpr) -> SglExprList: ...
    def system(
        self, expr: str | SglExpr | None = None
    ) -> SglExprList | AbstractContextManager[None]:
        return self._role("system", expr)

    @overload
    def user(self, expr: None = None) -> AbstractContextManager[None]: ...
    @overload
    def user(self, expr: str | SglExpr) -> SglExprList: ...
    def user(self, expr: str | SglExpr | None = None) -> SglExprList | AbstractContextManager[None]:
        return self._role("user", expr)

    @overload
    def assistant(self, expr: None = None) -> AbstractContextManager[None]: ...
    @overload
    def assistant(self, expr: str | SglExpr) -> SglExprList: ...
    def assistant(
        self, expr: str | SglExpr | None = None
    ) -> SglExprList | AbstractContextManager[None]:
        return self._role("assistant", expr)
