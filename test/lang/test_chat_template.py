"""Role markers read off the served model's Jinja chat template (and the by-name fallback)."""

from __future__ import annotations

import pytest

from radixgen.lang.chat_template import (
    TemplateShapeError,
    chat_template_from_folder,
    chat_template_from_jinja,
    get_chat_template,
    get_chat_template_by_model_path,
)

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CONVERSATION = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me a joke."},
]


@pytest.fixture(scope="module")
def model_tokenizer(default_model_folder):
    from radixgen.runtime.text.tokenizer import Tokenizer

    return Tokenizer(default_model_folder)


def test_default_model_template_is_chatml_with_its_system_prompt(default_model_folder):
    template = chat_template_from_folder(default_model_folder)
    assert template is not None
    assert template.role_prefix_and_suffix == get_chat_template("chatml").role_prefix_and_suffix
    assert template.default_system_prompt == SMOLLM_SYSTEM
    assert template.stop_str == ("<|im_end|>",)


@pytest.mark.parametrize("with_system", [False, True])
def test_rendering_matches_the_tokenizers_own_template(
    default_model_folder, model_tokenizer, with_system
):
    template = chat_template_from_folder(default_model_folder)
    messages = ([{"role": "system", "content": "Be brief."}] if with_system else []) + CONVERSATION
    expected = model_tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    assert template.get_prompt(messages) == expected


def test_other_template_shapes():
    llama3 = (
        "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )
    template = chat_template_from_jinja(llama3)
    assert template.role_prefix_and_suffix["user"] == (
        "<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>",
    )  # fmt: skip
    assert template.default_system_prompt is None and template.stop_str == ("<|eot_id|>",)
    refusing = "{{ raise_exception('only user and assistant roles') }}"
    with pytest.raises(TemplateShapeError):
        chat_template_from_jinja(refusing)


def test_templates_by_model_name():
    assert get_chat_template_by_model_path("HuggingFaceTB/SmolLM2-135M-Instruct").name == "smollm"
    assert get_chat_template_by_model_path("Qwen/Qwen2-7B-Instruct").name == "qwen"
    assert get_chat_template_by_model_path("meta-llama/Llama-3-8B-Instruct").name == (
        "llama-3-instruct"
    )
    assert get_chat_template_by_model_path("some/unknown-model").name == "default"


def test_endpoint_uses_the_served_models_template(endpoint, engine_backend):
    for backend in (endpoint, engine_backend):
        template = backend.get_chat_template()
        assert template.default_system_prompt == SMOLLM_SYSTEM
        assert template.stop_str == ("<|im_end|>",)


def test_template_from_reported_model_info(default_model_folder):
    """A server that reports its Jinja source in /get_model_info needs no shared filesystem."""
    from pathlib import Path

    from radixgen.lang.backend.runtime_endpoint import template_for_model

    source = (Path(default_model_folder) / "chat_template.jinja").read_text()
    reported = template_for_model(
        {"model_path": "remote-model", "chat_template": source, "eos_token": "<|im_end|>"}
    )
    assert reported.default_system_prompt == SMOLLM_SYSTEM and reported.name == "remote-model"
    by_name = template_for_model({"model_path": "SmolLM2-135M-Instruct", "tokenizer_path": "/nope"})
    assert by_name.name == "smollm"
