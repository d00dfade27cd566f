"""The public DSL: `@function`, `gen`, `select`, roles and backend helpers (SGLang's names)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, overload

from radixgen.lang import constraints
from radixgen.lang.choices import ChoicesSamplingMethod, ConstrainedChoice, token_length_normalized
from radixgen.lang.function import SglFunction
from radixgen.lang.global_config import global_config
from radixgen.lang.interpreter import resolve_backend
from radixgen.lang.ir import (
    SglExpr,
    SglExprList,
    SglGen,
    SglRoleBegin,
    SglRoleEnd,
    SglSamplingParams,
    SglSelect,
    SglSeparateReasoning,
    as_expr,
)
from radixgen.reasoning_parser import REASONING_FORMATS


@overload
def function(
    func: Callable[..., object], num_api_spec_tokens: int | None = None
) -> SglFunction: ...
@overload
def function(
    func: None = None, num_api_spec_tokens: int | None = None
) -> Callable[[Callable[..., object]], SglFunction]: ...
def function(
    func: Callable[..., object] | None = None, num_api_spec_tokens: int | None = None
) -> SglFunction | Callable[[Callable[..., object]], SglFunction]:
    """Decorator: `@function` or `@function(...)` turns `def prog(s, ...)` into a program."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)


def set_default_backend(backend: object) -> None:
    """The backend programs use when run() gets none (a radixgen.Engine is wrapped)."""
    global_config.default_backend = resolve_backend(backend) if backend is not None else None


def flush_cache(backend: object = None) -> object:
    """Empty the server's prefix cache (returns False when there is no backend)."""
    if backend is None and global_config.default_backend is None:
        return False
    return resolve_backend(backend).flush_cache()


def get_server_info(backend: object = None) -> object:
    if backend is None and global_config.default_backend is None:
        return None
    return resolve_backend(backend).get_server_info()


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: list[str] | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
    regex: str | None = None,
    json_schema: str | Mapping[str, object] | type | None = None,
    lora_path: str | None = None,
) -> SglExpr:
    """Generate text into variable `name`; None inherits the run()-level default (`lora_path`,
    the LoRA adapter this call runs under, too).

    `choices` makes it a `select`, as in SGLang: each choice is scored by its prompt logprobs
    (`choices_method`, default token_length_normalized) and the meta holds
    normalized_prompt_logprobs / input_token_logprobs / output_token_logprobs;
    `choices_method=constrained_choice` decodes under a grammar of the choices instead (one
    request, sampled at `temperature`, the usual generate meta). `dtype` (int/float/str/bool)
    and `regex` constrain decoding; `json_schema` (dict, JSON text or pydantic model class)
    constrains to the schema. `s[name]` is always the text; `s.parsed(name)` the typed value.
    """
    if choices is not None and not choices:
        raise ValueError(f"gen({name!r}): choices must not be empty")
    if choices and not isinstance(choices_method, ConstrainedChoice):
        return select(name, list(choices), 0.0 if temperature is None else temperature,
                      choices_method or token_length_normalized, lora_path)  # fmt: skip
    if regex is not None:
        constraints.check_regex(regex)
    if dtype is not None:
        constraints.dtype_name(dtype)
    model = None
    if json_schema is not None:
        json_schema, model = constraints.normalize_json_schema(json_schema)
    if choices and temperature is None:
        temperature = 0.0  # like select: the most likely choice unless asked to sample
    params = SglSamplingParams.overrides(
        max_new_tokens=max_tokens,
        min_new_tokens=min_tokens,
        n=n,
        stop=stop,
        stop_token_ids=stop_token_ids,
        stop_regex=stop_regex,
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
        dtype=dtype,
        regex=regex,
        json_schema=json_schema,
        choices=list(choices) if choices else None,
        lora_path=lora_path,
    )
    node = SglGen(name, params)
    if dtype is not None or json_schema is not None:
        node.parser = constraints.parser_for(dtype, model, is_json=json_schema is not None)
    return node


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> SglExpr:
    """gen(dtype=int): digits only, ends at the first space or newline."""
    _no_constraint_kwargs("gen_int", kwargs)
    return gen(name, max_tokens, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> SglExpr:
    """gen(dtype=str): a double-quoted string of word characters and spaces."""
    _no_constraint_kwargs("gen_string", kwargs)
    return gen(name, max_tokens, dtype=str, **kwargs)


def _no_constraint_kwargs(who: str, kwargs: dict[str, object]) -> None:
    bad = sorted({"min_tokens", "dtype", "regex", "json_schema", "choices"} & set(kwargs))
    if bad:
        raise TypeError(f"{who}() does not take {', '.join(bad)}")


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
    lora_path: str | None = None,
) -> SglExpr:
    """Append the most likely of `choices` (scored by prompt logprobs) and store it in `name`;
    `choices_method=constrained_choice` decodes under a grammar of the choices instead.
    `lora_path` scores under that adapter (None: the run's)."""
    if not choices:
        raise ValueError(f"select({name!r}) needs a non-empty list of choices")
    if not all(isinstance(c, str) for c in choices):
        raise TypeError(f"select({name!r}): every choice must be a string")
    if isinstance(choices_method, ConstrainedChoice):
        return gen(name, choices=list(choices), choices_method=choices_method,
                   temperature=temperature, lora_path=lora_path)  # fmt: skip
    return SglSelect(name, list(choices), temperature, choices_method, lora_path)


def _role(role: str, expr: str | SglExpr | None = None) -> SglExprList:
    if expr is None:
        return SglExprList([SglRoleBegin(role), SglRoleEnd(role)])
    return SglExprList([SglRoleBegin(role), as_expr(expr), SglRoleEnd(role)])


def system(expr: str | SglExpr | None = None) -> SglExprList:
    return _role("system", expr)


def user(expr: str | SglExpr | None = None) -> SglExprList:
    return _role("user", expr)


def assistant(expr: str | SglExpr | None = None) -> SglExprList:
    return _role("assistant", expr)


def system_begin() -> SglRoleBegin:
    return SglRoleBegin("system")


def system_end() -> SglRoleEnd:
    return SglRoleEnd("system")


def user_begin() -> SglRoleBegin:
    return SglRoleBegin("user")


def user_end() -> SglRoleEnd:
    return SglRoleEnd("user")


def assistant_begin() -> SglRoleBegin:
    return SglRoleBegin("assistant")


def assistant_end() -> SglRoleEnd:
    return SglRoleEnd("assistant")


def image(path_or_bytes: str | bytes) -> SglExpr:
    raise NotImplementedError("image(): RadixGen serves text-only models")


def video(path: str, num_frames: int) -> SglExpr:
    raise NotImplementedError("video(): RadixGen serves text-only models")


def separate_reasoning(expr: SglExpr | None = None, model_type: str | None = None) -> SglExpr:
    """`s += separate_reasoning(gen("x"), model_type="deepseek-r1")`: run the gen, then split its
    `<think>` reasoning into `s["x_reasoning_content"]`, leaving the answer in `s["x"]` and in
    the text (model types: radixgen.reasoning_parser, SGLang's names)."""
    if model_type not in REASONING_FORMATS:
        raise ValueError(
            f"separate_reasoning: model_type must be one of {', '.join(REASONING_FORMATS)}, "
            f"got {model_type!r}"
        )
    return SglExprList([as_expr(expr), SglSeparateReasoning(model_type, expr)])
