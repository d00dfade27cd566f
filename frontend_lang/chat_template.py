"""Role markers for `system/user/assistant`: read off the served model's own Jinja template when a
backend can provide it, else picked by model name from the registry (chat_template_data.py holds
the templates and the name rules; SGLang's approach).

A `ChatTemplate` is "plain": each role has a fixed (prefix, suffix), the first non-system role
inserts `default_system_prompt` when there is one, and `stop_str` ends every gen (the template's
end-of-turn marker, as SGLang's stop_str).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixgen.lang.chat_template_base import ChatTemplate as ChatTemplate
from radixgen.lang.chat_template_data import BUILTIN_TEMPLATES, NAME_RULES, SOURCE_RULES

_REGISTRY: dict[str, ChatTemplate] = {}


def _registry() -> dict[str, ChatTemplate]:
    """The registry, filled with chat_template_data's templates on first use."""
    if "default" not in _REGISTRY:
        for template in BUILTIN_TEMPLATES:
            _REGISTRY.setdefault(template.name, template)
    return _REGISTRY


def get_chat_template(name: str) -> ChatTemplate:
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown chat template {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name]


def register_chat_template(template: ChatTemplate) -> None:
    """Add or replace a template by its name."""
    _registry()[template.name] = template


def chat_template_names() -> list[str]:
    return sorted(_registry())


def match_chat_template_name(model_path: str) -> str | None:
    """The registered template a model path names (SGLang's rules, plus SmolLM and Phi-3)."""
    for pattern, veto, name in NAME_RULES:
        if re.search(pattern, model_path, re.IGNORECASE) and not (
            veto and re.search(veto, model_path, re.IGNORECASE)
        ):
            return name
    return None


def match_chat_template_by_source(source: str) -> str | None:
    """The registered template whose family's markers a Jinja chat template writes."""
    for markers, name in SOURCE_RULES:
        if all(m in source for m in markers):
            return name
    return None


def get_chat_template_by_model_path(model_path: str) -> ChatTemplate:
    """The template for a model path or name by its family's name; "default" when none matches.
    Backends prefer the model's own Jinja template when they can read it (runtime_endpoint.py)."""
    return get_chat_template(match_chat_template_name(model_path) or "default")


# --- reading the role markers off a Jinja chat template --------------------------------------

_MARK = {"system": "\x02SYS\x03", "user": "\x02USR\x03", "assistant": "\x02AST\x03"}


class TemplateShapeError(ValueError):
    """The Jinja template is not expressible as fixed per-role prefixes and suffixes."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def chat_template_from_jinja(source: str, eos_token: str = "", name: str = "model") -> ChatTemplate:
    """Role prefixes/suffixes, default system prompt and end-of-turn stop of a Jinja template.

    Renders conversations whose contents are unique markers and reads what surrounds them. The
    BOS token is rendered empty: the server's tokenizer adds it when the model wants one.
    """
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, indent=indent)
    template = env.from_string(source)

    def render(roles: list[str], add_generation_prompt: bool = False) -> str:
        msgs = [{"role": r, "content": _MARK[r]} for r in roles]
        return template.render(
            messages=msgs,
            add_generation_prompt=add_generation_prompt,
            bos_token="",
            eos_token=eos_token,
            tools=None,
        )

    try:
        full = render(["system", "user", "assistant"])
        turn = render(["system", "user"])
        prompt = render(["system", "user"], add_generation_prompt=True)
        without_system = render(["user"])
        try:
            system_only: str | None = render(["system"])
        except TemplateError:
            system_only = None
    except TemplateError as e:
        raise TemplateShapeError(f"the template refused a plain conversation: {e}") from e
    s, u, a = _MARK["system"], _MARK["user"], _MARK["assistant"]
    if not (s in full and u in full and a in full and prompt.startswith(turn)):
        raise TemplateShapeError("the template drops or reorders message contents")
    system_prefix = full[: full.index(s)]
    user_suffix = turn[turn.index(u) + len(u) :]
    assistant_prefix = prompt[len(turn) :]
    assistant_suffix = full[full.index(a) + len(a) :]
    between = full[full.index(s) + len(s) : full.index(u)]
    if system_only is not None and s in system_only:
        system_suffix = system_only[system_only.index(s) + len(s) :]
    else:
        system_suffix = user_suffix
    if not between.startswith(system_suffix):
        raise TemplateShapeError("cannot split the system suffix from the user prefix")
    user_prefix = between[len(system_suffix) :]
    roles = {
        "system": (system_prefix, system_suffix),
        "user": (user_prefix, user_suffix),
        "assistant": (assistant_prefix, assistant_suffix),
    }
    expected = "".join(p + _MARK[r] + q for r, (p, q) in roles.items())
    if full != expected:
        raise TemplateShapeError("role markers differ between positions in the conversation")
    user_turn = user_prefix + u + user_suffix
    default_system = None
    if without_system != user_turn:
        head = without_system[: -len(user_turn)] if without_system.endswith(user_turn) else None
        if head is None or not (head.startswith(system_prefix) and head.endswith(system_suffix)):
            raise TemplateShapeError("the template adds text that is not a system message")
        default_system = head[len(system_prefix) : len(head) - len(system_suffix)]
    stop = assistant_suffix.strip() or eos_token
    return ChatTemplate(
        name=name,
        default_system_prompt=default_system,
        role_prefix_and_suffix=roles,
        stop_str=(stop,) if stop else (),
    )


def chat_template_for_source(source: str, eos_token: str = "", name: str = "model") -> ChatTemplate:
    """The model's own template: its role markers read off the Jinja source, else (a template
    not expressible as fixed markers) the registered template of the family whose markers the
    source writes; TemplateShapeError when neither works."""
    try:
        return chat_template_from_jinja(source, eos_token=eos_token, name=name)
    except TemplateShapeError:
        family = match_chat_template_by_source(source)
        if family is None:
            raise
        return get_chat_template(family)


def chat_template_from_folder(folder: str | Path) -> ChatTemplate | None:
    """The template of a local model/tokenizer folder, or None if it has none or is unreadable."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    jinja = folder / "chat_template.jinja"
    source = jinja.read_text() if jinja.is_file() else config.get("chat_template")
    if not isinstance(source, str):
        return None
    eos = config.get("eos_token") or ""
    eos = eos.get("content", "") if isinstance(eos, dict) else eos
    return chat_template_for_source(source, eos_token=eos, name=folder.name)
