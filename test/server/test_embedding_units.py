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


def test_an_embedding_model_is_refused_tensor_parallelism_before_any_start() -> None:
    pytest.importorskip("all_minilm_l6_v2", reason="the default embedding model is a test extra")
    from radixgen.runtime.launch.launcher import launch_engine_processes
    from radixgen.server_args import ServerArgs

    args = ServerArgs.from_kwargs(is_embedding=True, tp_size=2)
    with pytest.raises(InvalidRequestError) as err:
        launch_engine_processes(args)
    assert err.value.param == "tp_size"


def test_rerank_prompt_fills_the_template_in_one_pass() -> None:
    from radixgen.runtime.text.rerank_prompt import (
        DEFAULT_RERANK_TEMPLATE,
        parse_reranker_tokens,
        rerank_prompt,
        rerank_template,
    )

    assert (
        rerank_prompt("Q={query} D={document}", "{document}", "x{query}")
        == "Q={document} D=x{query}"
    )
    assert "<Query>: q\n<Document>: d<|im_end|>" in rerank_prompt(DEFAULT_RERANK_TEMPLATE, "q", "d")
    assert parse_reranker_tokens(" yes , no") == ("yes", "no")
    for bad in ("yes", "yes,", "a,b,c"):
        with pytest.raises(InvalidRequestError):
            parse_reranker_tokens(bad)
    with pytest.raises(InvalidRequestError):
        rerank_template("no placeholders here")
