"""`separate_reasoning(gen(...), model_type=...)` as in SGLang: the reasoning moves to
`<name>_reasoning_content`, out of the variable and the program text. The reply is steered into
the think format by a regex, so the tiny model's output is deterministic in shape."""

from __future__ import annotations

import pytest

import radixgen as sgl

REGEX = {
    "deepseek-r1": r"[a-z]{2,8}( [a-z]{2,8}){0,2}</think>[A-Z][a-z]{1,8}",
    "qwen3": r"<think>[a-z]{2,8}( [a-z]{2,8}){0,2}</think>[A-Z][a-z]{1,8}",
}


@sgl.function
def reasoning_then_answer(s, model_type):
    s += sgl.user("Is the sky blue? Think first.")
    s += sgl.assistant(
        sgl.separate_reasoning(
            sgl.gen("answer", max_tokens=40, temperature=0, regex=REGEX[model_type]),
            model_type=model_type,
        )
    )
    s += sgl.user("Say it again.")


@pytest.mark.parametrize("model_type", ["deepseek-r1", "qwen3"])
def test_reasoning_goes_to_its_own_variable(endpoint, model_type):
    state = reasoning_then_answer.run(model_type=model_type, backend=endpoint)
    reasoning, answer = state["answer_reasoning_content"], state["answer"]
    assert reasoning and "think>" not in reasoning
    assert answer[:1].isupper() and answer.isalpha(), answer
    assert "think>" not in state.text()
    assert state.messages()[-2] == {"role": "assistant", "content": answer}


def test_separate_reasoning_names_its_mistakes():
    with pytest.raises(ValueError, match="model_type"):
        sgl.separate_reasoning(sgl.gen("x"), model_type="nope")
    with pytest.raises(ValueError, match="named"):
        sgl.separate_reasoning(sgl.gen(), model_type="qwen3")
