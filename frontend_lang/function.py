"""SglFunction: what `@function` returns; run / run_batch / bind / trace / cache a program."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from radixgen.lang.batch import cache_program, run_program_batch
from radixgen.lang.global_config import global_config
from radixgen.lang.interpreter import resolve_backend, run_program
from radixgen.lang.ir import SglSamplingParams
from radixgen.lang.run_trace import TraceScope
from radixgen.lang.tracer import StopTracing, TracerProgramState, current_tracer, trace_program

if TYPE_CHECKING:
    from radixgen.lang.backend.base import BaseBackend
    from radixgen.lang.interpreter import ProgramState


def _run_defaults(
    max_new_tokens: int,
    n: int,
    stop: str | list[str] | None,
    stop_token_ids: list[int] | None,
    stop_regex: str | list[str] | None,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    frequency_penalty: float,
    presence_penalty: float,
    ignore_eos: bool,
    return_logprob: bool | None,
    logprob_start_len: int | None,
    top_logprobs_num: int | None,
    return_text_in_logprobs: bool | None,
    lora_path: str | None,
) -> SglSamplingParams:
    return SglSamplingParams(
        max_new_tokens=max_new_tokens,
        n=n,
        stop=[] if stop is None else stop,
        stop_token_ids=[] if stop_token_ids is None else stop_token_ids,
        stop_regex=[] if stop_regex is None else stop_regex,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        ignore_eos=ignore_eos,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
        lora_path=lora_path,
    )


class SglFunction:
    """A program: a Python function whose first parameter `s` is the program state."""

    def __init__(
        self,
        func: Callable[..., object],
        num_api_spec_tokens: int | None = None,
        bind_arguments: dict[str, object] | None = None,
    ) -> None:
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = bind_arguments or {}
        spec = inspect.getfullargspec(func)
        if not spec.args or spec.args[0] != "s":
            raise TypeError(
                f"the first parameter of program {func.__name__!r} must be named 's' "
                f"(the program state), got {spec.args[:1] or 'none'}"
            )
        self.arg_names = spec.args[1:]
        self.arg_defaults = spec.defaults or ()
        self.__name__ = func.__name__
        self.__doc__ = func.__doc__

    def bind(self, **kwargs: object) -> SglFunction:
        """A copy with some arguments fixed (they also become part of the traced prefix)."""
        unknown = sorted(set(kwargs) - set(self.arg_names))
        if unknown:
            raise TypeError(f"{self.__name__}() has no parameter(s) {', '.join(unknown)}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def run(
        self,
        *args: object,
        max_new_tokens: int = 128,
        n: int = 1,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        lora_path: str | None = None,
        stream: bool = False,
        backend: object = None,
        use_thread: bool = True,
        trace: bool | None = None,
        **kwargs: object,
    ) -> ProgramState:
        """Run once; the sampling keywords are defaults each gen() may override. `lora_path`
        names the LoRA adapter every request of the run uses (a gen/select may name another).
        `trace=True` tags every request with the run's trace id (`state.trace_id`) for the
        dashboard."""
        defaults = _run_defaults(
            max_new_tokens, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k,
            min_p, frequency_penalty, presence_penalty, ignore_eos, return_logprob,
            logprob_start_len, top_logprobs_num, return_text_in_logprobs, lora_path,
        )  # fmt: skip
        trace = self._take_trace(trace, kwargs)
        scope = TraceScope.new(self.__name__) if trace else None
        return run_program(self, backend, args, kwargs, defaults, stream, use_thread, trace=scope)

    def run_batch(
        self,
        batch_kwargs: list[dict[str, object]] | list[tuple[object, ...]] | list[list[object]],
        *,
        max_new_tokens: int = 128,
        n: int = 1,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        lora_path: str | None = None,
        backend: object = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        trace: bool = False,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per argument set (dicts, or positional tuples) on a thread pool; `trace=True`
        makes the batch one trace, each program a branch `item<i>` of it."""
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of argument dicts (or tuples)")
        if not batch_kwargs:
            return []
        batch = [self._as_kwargs(item) for item in batch_kwargs]
        defaults = _run_defaults(
            max_new_tokens, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k,
            min_p, frequency_penalty, presence_penalty, ignore_eos, return_logprob,
            logprob_start_len, top_logprobs_num, return_text_in_logprobs, lora_path,
        )  # fmt: skip
        return run_program_batch(
            self, backend, batch, defaults, num_threads, progress_bar, generator_style, trace
        )

    def _take_trace(self, trace: bool | None, kwargs: dict[str, object]) -> bool:
        """`trace=` of run(); NOTE: a program with its own `trace` parameter gets it, as before."""
        if "trace" in self.arg_names:
            if trace is not None:
                kwargs["trace"] = trace
            return False
        return bool(trace)

    def _as_kwargs(self, item: object) -> dict[str, object]:
        if isinstance(item, dict):
            return item
        if isinstance(item, (list, tuple)):
            required = len(self.arg_names) - len(self.arg_defaults)
            if required <= len(item) <= len(self.arg_names):
                return dict(zip(self.arg_names, item, strict=False))
        raise TypeError(
            f"{self.__name__}: batch item {item!r} does not match parameters {self.arg_names}"
        )

    def trace(self, *, backend: object = None, **kwargs: object) -> TracerProgramState:
        """The program's IR (a TracerProgramState; `print(f.trace())` lists the nodes)."""
        return trace_program(self, kwargs, _backend_or_none(backend))

    def cache(self, backend: object = None) -> str:
        """Prefill the program's constant prefix now; returns that prefix."""
        return cache_program(self, backend)

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        # Any: forwarded to run(), whose keywords mix the program's arguments with run's own
        if current_tracer() is not None:
            raise StopTracing()  # a nested program call: its text is not known while tracing
        return self.run(*args, **kwargs)

    def __repr__(self) -> str:
        return f"SglFunction({self.__name__})"


def _backend_or_none(backend: object) -> BaseBackend | None:
    if backend is None and global_config.default_backend is None:
        return None
    return resolve_backend(backend)
