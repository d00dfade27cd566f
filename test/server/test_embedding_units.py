"""The embedding routes' input parsing and base64 encoding on their own (no server)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from radixgen.errors import InvalidRequestError
from radixgen.runtime.entrypoints.embedding_request import split_inputs
from radixgen.runtime.entrypoints.openai.serving_embedding import encode_base64


def test_split_inputs_forms() -> None:
    assert split_inputs("a", "input") == (["a"], None, False)
    assert split_inputs(["a", "b"], "input") == (["a", "b"], None, True)
    assert split_inputs([1, 2], "input") == (None, [[1, 2]], False)
    assert split_inputs([[1], [2, 3]], "input") == (None, [[1], [2, 3]], True)


@pytest.mark.parametrize("bad", [[], [1, "a"], [[1], "a"], [True], 3, None, [[1.5]]])
def test_split_inputs_refuses_other_shapes(bad: object) -> None:
    with pytest.raises(InvalidRequestError) as err:
        split_inputs(bad, "input")
    assert err.value.param == "input"


def test_base64_is_little_endian_float32() -> None:
    vec = [0.5, -1.25, 3.0e-8]
    decoded = np.frombuffer(base64.b64decode(encode_base64(vec)), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.array(vec, dtype=np.float32))
