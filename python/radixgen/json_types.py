"""The type of a decoded JSON document, for the package's boundaries instead of `Any`.

`JSONValue` is what `json.loads` / `orjson.loads` return; `JSONObject` is a JSON object (a request
body, a tool's parameters, a JSON-Schema document). Code that reads one narrows it with
`isinstance` as it goes, which the type checker then follows.

The alias is a `TypeAliasType` so pydantic can build a validator for it (a plain recursive alias
sends pydantic into unbounded recursion). The request models do not validate with it, though:
pydantic's recursion guard refuses a document nested past ~255 levels with its own message, where
a deep schema must reach the grammar depth limit's 400; their fields are the `JSONField` /
`JSONObjectField` of radixgen.runtime.entrypoints.openai.json_fields, validated as `Any` was.
Imports no torch (the core's rule).
"""

from __future__ import annotations

from typing import TypeAlias, TypeGuard

from typing_extensions import TypeAliasType

JSONValue = TypeAliasType(
    "JSONValue",
    "bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None",
)
"""Any decoded JSON value: null, a boolean, a number, a string, an array or an object."""

JSONObject: TypeAlias = dict[str, JSONValue]
"""A decoded JSON object."""

JSONArray: TypeAlias = list[JSONValue]
"""A decoded JSON array."""

__all__ = ["JSONArray", "JSONObject", "JSONValue", "is_str_list", "is_token_ids"]


def is_str_list(value: object) -> TypeGuard[list[str]]:
    """A list of strings (a decoded batch of texts)."""
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def is_token_ids(value: object) -> TypeGuard[list[int]]:
    """A list of ints that are not bools (decoded token ids)."""
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )
