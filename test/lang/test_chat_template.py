"""Role markers read off the served model's Jinja chat template (and the by-name fallback)."""

from __future__ import annotations

import pytest

from radixgen.lang.chat_template import (
    TemplateShapeError,
    chat_template_from_folder,
    chat_template_from_jinja,
    chat_template_names,
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


@pytest.mark.parametrize(
    ("model_path", "name"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-instruct"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-instruct"),
        ("meta-llama/Llama-2-7b-chat-hf", "llama-2-chat"),
        ("codellama/CodeLlama-7b-Instruct-hf", "llama-2-chat"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen"),
        ("Qwen/Qwen2-VL-7B-Instruct", "qwen2-vl"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistral"),
        ("google/gemma-2-9b-it", "gemma-it"),
        ("google/gemma-3-4b-pt", "gemma-it"),
        ("microsoft/Phi-3-mini-4k-instruct", "phi-3"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm"),
        ("/models/smollm2-135m-instruct-q8_0.gguf", "smollm"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
        ("deepseek-ai/DeepSeek-V3-Base", "default"),  # a base model has no chat format
        ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "chatml"),
        ("lmsys/vicuna-7b-v1.5", "vicuna_v1.1"),
        ("01-ai/Yi-1.5-34B-Chat", "yi-1.5"),
        ("CohereForAI/c4ai-command-r-v01", "c4ai-command-r"),
        ("ibm-granite/granite-3.0-8b-instruct", "granite-3-instruct"),
        ("databricks/dbrx-instruct", "dbrx-instruct"),
        ("some/unknown-model", "default"),
    ],
)
def test_templates_by_model_name(model_path, name):
    assert get_chat_template_by_model_path(model_path).name == name


def test_registry_has_sglangs_template_names():
    sglang_names = {
        "default", "claude", "chatml", "chatml-llava", "qwen", "qwen2-vl", "vicuna_v1.1",
        "llama-2-chat", "mistral", "llama-3-instruct", "minicpmv", "janus-pro", "minicpmo",
        "janus", "llama-3-instruct-llava", "llama-4", "yi-1.5", "yi-vl", "gemma-it", "gemma-4-it",
        "dbrx-instruct", "c4ai-command-r", "internvl-2-5", "interns1", "granite-3-instruct",
        "deepseek-v3", "glm-4v",
    }  # fmt: skip
    assert sglang_names <= set(chat_template_names())
    with pytest.raises(ValueError, match="unknown chat template 'nope'; known: c4ai-command-r"):
        get_chat_template("nope")


TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\nHello!<|im_end|>\n"),
        ("llama-3-instruct", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                             "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"),
        # Llama 2: the system prompt sits inside the first [INST] block, before the user's text
        ("llama-2-chat", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello! </s><s>"),
        ("mistral", "[SYSTEM_PROMPT] Be brief. [/SYSTEM_PROMPT][INST] Hi [/INST]Hello! </s><s>"),
        # Gemma has no system turn: its text leads the first user turn's content
        ("gemma-it", "Be brief.<start_of_turn>user\nHi<end_of_turn>\n"
                     "<start_of_turn>model\nHello!<end_of_turn>\n"),
        ("phi-3", "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"),
        ("deepseek-v3", "Be brief.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜>"),
        ("c4ai-command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|>"
                           "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>"
                           "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello!<|END_OF_TURN_TOKEN|>"),
        ("granite-3-instruct", "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>"
                               "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>"
                               "<|start_of_role|>assistant<|end_of_role|>Hello!<|end_of_text|>"),
        ("vicuna_v1.1", "Be brief. USER:Hi ASSISTANT:Hello!</s>"),
    ],
)  # fmt: skip
def test_each_family_renders_its_turn_format(name, expected):
    assert get_chat_template(name).get_prompt(TURNS) == expected


def test_default_system_prompts_and_stops():
    qwen = get_chat_template("qwen")
    assert qwen.get_prompt(TURNS[1:]).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi"
    )
    llama2 = get_chat_template("llama-2-chat")
    # without a system turn the first user turn opens its own [INST] block
    assert llama2.get_prompt(TURNS[1:]) == "[INST] Hi [/INST]Hello! </s><s>"
    assert get_chat_template("smollm").default_system_prompt == SMOLLM_SYSTEM
    assert get_chat_template("smollm").role_prefix_and_suffix == (
        get_chat_template("chatml").role_prefix_and_suffix
    )
    stops = {n: get_chat_template(n).stop_str for n in ("llama-3-instruct", "phi-3", "gemma-it")}
    assert stops == {
        "llama-3-instruct": ("<|eot_id|>",), "phi-3": ("<|end|>",), "gemma-it": ("<end_of_turn>",),
    }  # fmt: skip


# the families' published Jinja templates (trimmed to the message loop): reading the role markers
# off them gives the registered template, so the registry and the model's own template agree
FAMILY_JINJA = {
    "llama-3-instruct": (
        "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n'"
        " + m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
    "qwen": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "phi-3": (
        "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content']"
        " + '<|end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}"
        "{% endif %}"
    ),
}


@pytest.mark.parametrize("name", sorted(FAMILY_JINJA))
def test_registered_templates_match_the_families_jinja(name):
    from_jinja = chat_template_from_jinja(FAMILY_JINJA[name], name=name)
    registered = get_chat_template(name)
    assert from_jinja.role_prefix_and_suffix == registered.role_prefix_and_suffix
    assert from_jinja.default_system_prompt == registered.default_system_prompt
    assert from_jinja.stop_str == registered.stop_str


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


# templates that are not fixed per-role markers: Gemma refuses a system turn, Llama 2 folds the
# system prompt into the first [INST] block (the families' published Jinja)
GEMMA_JINJA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
    "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)
LLAMA2_JINJA = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
    "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}"
    "{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)


def _render(source: str, messages: list[dict[str, str]], **tokens: str) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment()
    env.globals["raise_exception"] = lambda message: pytest.fail(message)
    return env.from_string(source).render(messages=messages, **tokens)


def test_a_models_own_template_names_its_family_when_not_plain():
    from radixgen.lang.backend.runtime_endpoint import template_for_model
    from radixgen.lang.chat_template import chat_template_for_source

    for source, family in ((GEMMA_JINJA, "gemma-it"), (LLAMA2_JINJA, "llama-2-chat")):
        with pytest.raises(TemplateShapeError):
            chat_template_from_jinja(source)
        assert chat_template_for_source(source).name == family
        # a local checkpoint whose name says nothing: the template it serves decides
        served = template_for_model({"model_path": "/ckpt/step-1000", "chat_template": source})
        assert served.role_prefix_and_suffix == get_chat_template(family).role_prefix_and_suffix
    # the registered templates render these conversations as the models' own Jinja does
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"}]  # fmt: skip
    assert get_chat_template("gemma-it").get_prompt(chat) == _render(GEMMA_JINJA, chat)
    # Llama 2: the model's reply starts with a space, and the tokenizer adds the first <s>
    chat[1]["content"] = " Hello!"
    for turns in (chat, [{"role": "system", "content": "Be brief."}, *chat]):
        expected = _render(LLAMA2_JINJA, turns, bos_token="<s>", eos_token="</s>")
        assert "<s>" + get_chat_template("llama-2-chat").get_prompt(turns) == expected
    with pytest.raises(TemplateShapeError):
        chat_template_for_source("{{ raise_exception('only user and assistant roles') }}")
