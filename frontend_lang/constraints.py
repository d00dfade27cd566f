"""Turn gen()'s typed outputs into constraints the server decodes under, and parse the results.

`dtype` becomes a regex (SGLang's patterns and extra stops), a `json_schema` may be a dict, JSON
text or a pydantic model class (sent as JSON text); `parser_for` gives the function that turns the
generated text into a Python value for `state.parsed(name)`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

# the same patterns SGLang's RuntimeEndpoint sends for each dtype
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

_DTYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool", "string": "str"}


def dtype_name(dtype: object) -> str:
    """'int' | 'float' | 'str' | 'bool' for a type or its name; anything else is an error."""
    name = _DTYPE_NAMES.get(dtype, dtype)
    if not isinstance(name, str) or name not in ("int", "float", "str", "bool"):
        raise ValueError(f"dtype must be int, float, str or bool (type or name), got {dtype!r}")
    return name


def dtype_regex(dtype: object) -> tuple[str, list[str]]:
    """(regex, extra stop strings) for a dtype; numbers stop at the first space or newline."""
    name = dtype_name(dtype)
    if name == "int":
        return REGEX_INT, [" ", "\n"]
    if name == "float":
        return REGEX_FLOAT, [" ", "\n"]
    if name == "bool":
        return REGEX_BOOL, []
    return REGEX_STR, []


def check_regex(regex: str) -> None:
    """Fail at the gen() call (the program's own line) for a pattern Python cannot compile."""
    try:
        re.compile(regex)
    except re.error as e:
        raise ValueError(f"invalid regex {regex!r}: {e}") from e


def normalize_json_schema(schema: object) -> tuple[str, type | None]:
    """(schema as JSON text, the pydantic model class if one was given)."""
    if isinstance(schema, str):
        try:
            loaded = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from e
        if not isinstance(loaded, (dict, bool)):
            raise ValueError("json_schema must be a JSON object")
        return schema, None
    if isinstance(schema, dict):
        return json.dumps(schema), None
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema()), schema
    raise TypeError(
        "json_schema must be a dict, a JSON string or a pydantic model class, "
        f"got {type(schema).__name__}"
    )


def parser_for(
    dtype: object = None, model: type | None = None, is_json: bool = False
) -> Callable[[str], object]:
    """The function that turns a gen's text into its typed value (raises ValueError if it can't)."""
    if model is not None:
        return lambda text: model.model_validate_json(text)  # type: ignore[attr-defined]
    if is_json:
        return json.loads
    if dtype is None:
        return lambda text: text
    name = dtype_name(dtype)
    if name == "int":
        return lambda text: int(text.strip())
    if name == "float":
        return lambda text: float(text.strip())
    if name == "bool":
        return _parse_bool
    return _parse_quoted


def _parse_bool(text: str) -> bool:
    value = text.strip()
    if value not in ("True", "False"):
        raise ValueError(f"{text!r} is not True or False")
    return value == "True"


def _parse_quoted(text: str) -> str:
    value = text.strip()
    if len(value) < 2 or value[0] != '"' or value[-1] != '"':
        raise ValueError(f"{text!r} is not a quoted string")
    return value[1:-1]


def matches(regex: str, text: str) -> bool:
    """Whether free text (constrained decoding off) is a valid value of the constraint."""
    return re.fullmatch(regex, text) is not None
