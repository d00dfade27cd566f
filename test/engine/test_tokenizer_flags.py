"""`tokenizer_path` and `chat_template` (a file or inline text) reach every process; bad values
fail before any child starts, naming the flag."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import radixgen
from radixgen.errors import InvalidRequestError
from radixgen.runtime.model_loader import resolve_model_path

TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer_only(tmp_path_factory) -> Path:
    """A folder with the default model's tokenizer files and no weights."""
    model = Path(resolve_model_path(None))
    folder = tmp_path_factory.mktemp("tokenizer_only")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model / name).exists():
            shutil.copy(model / name, folder / name)
    return folder


@pytest.mark.slow  # starts an Engine
def test_template_file_and_tokenizer_folder_are_used(tmp_path, tokenizer_only):
    template_file = tmp_path / "plain.jinja"
    template_file.write_text(TEMPLATE)
    with radixgen.Engine(
        tokenizer_path=str(tokenizer_only),
        chat_template=str(template_file),
        grammar_backend="none",
        log_level="warning",
    ) as eng:
        assert eng.tokenizer.folder == tokenizer_only
        messages = [{"role": "user", "content": "Hi"}]
        assert eng.tokenizer.apply_chat_template(messages) == "[USER] Hi\n[ASSISTANT]"
        out = eng.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 4})
        assert out["meta_info"]["completion_tokens"] == 4 and out["text"]


@pytest.mark.slow  # starts an Engine
def test_inline_template_text_is_accepted(tokenizer_only):
    from radixgen.runtime.text.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model_path(None), str(tokenizer_only), TEMPLATE)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "[USER] x\n[ASSISTANT]"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tokenizer_path": "/nonexistent/tokenizer"}, "tokenizer_path"),
        ({"chat_template": "/nonexistent/template.jinja"}, "chat_template"),
    ],
)
def test_bad_flags_fail_before_start_naming_the_flag(kwargs, param):
    with pytest.raises(InvalidRequestError) as err:
        radixgen.Engine(grammar_backend="none", log_level="warning", **kwargs)
    assert err.value.param == param
