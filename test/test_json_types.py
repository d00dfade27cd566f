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
