"""radixgen.json_types: the JSON alias a pydantic field can take (a plain recursive alias cannot)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from radixgen.json_types import JSONObject, JSONValue


class _Body(BaseModel):
    value: JSONValue = None
    obj: JSONObject | None = None
    parts: str | list[JSONObject] | None = None


def test_a_json_document_validates_unchanged() -> None:
    doc = {"a": [1, 2.5, "s", None, True, {"b": {"c": []}}], "n": -3}
    body = _Body.model_validate({"value": doc, "obj": doc, "parts": [doc]})
    assert body.value == doc and body.obj == doc and body.parts == [doc]
    # a bool stays a bool, an int an int, a float a float (no union coercion)
    got = _Body.model_validate({"value": [True, 1, 1.0]}).value
    assert isinstance(got, list) and [type(v) for v in got] == [bool, int, float]
    assert body.model_dump()["obj"] == doc


def test_a_wrong_shape_fails_on_its_first_member_as_before() -> None:
    """parse_request reports the first error: for `str | list[...]` that is the `str` member's."""
    with pytest.raises(ValidationError) as e:
        _Body.model_validate({"parts": 5})
    first = e.value.errors(include_url=False)[0]
    assert first["loc"] == ("parts", "str") and first["type"] == "string_type"
    with pytest.raises(ValidationError):
        _Body.model_validate({"obj": [1]})


def test_request_model_json_fields_are_validated_as_any_was() -> None:
    """The request models' JSON fields: the type checker sees JSON, pydantic checks what it
    checked for `Any` / `dict[str, Any]` (a 900-deep schema must reach the grammar depth check)."""
    from typing import Any

    from radixgen.runtime.entrypoints.openai.json_fields import JSONField, JSONObjectField

    class New(BaseModel):
        doc: str | JSONObjectField | None = None
        parts: str | list[JSONObjectField] | None = None
        anything: JSONField = None

    class Old(BaseModel):
        doc: str | dict[str, Any] | None = None
        parts: str | list[dict[str, Any]] | None = None
        anything: Any = None

    deep: dict[str, object] = {}
    for _ in range(900):
        deep = {"a": deep}
    for model in (New, Old):  # the object is copied, its contents are not walked
        doc = model.model_validate({"doc": deep}).doc
        assert isinstance(doc, dict) and doc["a"] is deep["a"]
    assert New.model_validate({"anything": (1, 2)}).anything == (1, 2)
    for bad in ({"doc": 5}, {"doc": [1]}, {"parts": 5}, {"parts": [5]}, {"doc": {1: 2}}):
        errors = []
        for model in (New, Old):
            with pytest.raises(ValidationError) as e:
                model.model_validate(bad)
            errors.append(e.value.errors(include_url=False))
        assert errors[0] == errors[1], bad
    assert New.model_json_schema()["properties"] == Old.model_json_schema()["properties"]
