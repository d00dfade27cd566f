"""JSON fields of the pydantic request models: typed as JSON, validated as `Any` was.

`JSONField` is a `JSONValue` to the type checker and is not validated at all; `JSONObjectField`
is a `JSONObject` checked only to be an object with string keys (pydantic's `dict[str, Any]`
schema: same errors, same JSON Schema). Their contents are not walked: a request body is decoded
JSON already, and a deep document (a 900-level schema) must reach the grammar depth limits and
their 400 (pydantic's recursion guard would refuse one past ~255 levels with its own message).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema

from radixgen.json_types import JSONObject, JSONValue


class _Unchecked:
    """Any value as it is (the schema pydantic gives `Any`)."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: object, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.any_schema()


class _ObjectOfUnchecked:
    """An object with string keys, its values as they are (pydantic's `dict[str, Any]`)."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: object, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema())


JSONField = Annotated[JSONValue, _Unchecked]
JSONObjectField = Annotated[JSONObject, _ObjectOfUnchecked]
