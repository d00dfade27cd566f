"""The type of a decoded JSON document, for the package's boundaries instead of `Any`.

`JSONValue` is what `json.loads` / `orjson.loads` return; `JSONObject` is a JSON object (a request
body, a tool's parameters, a JSON-Schema document). Code that reads one narrows it with
`isinstance` as it goes, which the type checker then follows.

The alias is a `TypeAliasType` so pydantic can build a validator for a field of this type (a plain
recursive alias sends it into unbounded recursion); for a JSON body it accepts exactly what
`Any` did, since every decoded JSON value is one of these. Imports no torch (the core's rule).
"""

from __future__ import annotations

from typing import TypeAlias

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

__all__ = ["JSONArray", "JSONObject", "JSONValue"]
