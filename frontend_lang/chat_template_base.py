"""`ChatTemplate`, the role markers of one chat format: its own module so that the registry
(chat_template.py) and the templates it holds (chat_template_data.py) both import it without
importing each other. Users import it from `radixgen.lang.chat_template` (or `radixgen.lang`).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    name: str
    default_system_prompt: str | None
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    stop_str: tuple[str, ...] = ()
    image_token: str = "<image>"
    # "plain": fixed markers per role; "llama2": the first system turn opens the first [INST]
    # block and the user turn after it continues that block (Llama 2's format)
    style: str = "plain"

    def get_prefix_and_suffix(
        self, role: str, hist_messages: list[dict[str, Any]]
    ) -> tuple[str, str]:
        prefix, suffix = self.role_prefix_and_suffix.get(role, ("", ""))
        if self.style == "llama2":
            if role == "system" and not hist_messages:
                return self.role_prefix_and_suffix["user"][0] + prefix, suffix
            if role == "user" and len(hist_messages) == 1 and hist_messages[0]["role"] == "system":
                return "", suffix
        return prefix, suffix

    def get_prompt(self, messages: list[dict[str, Any]]) -> str:
        """Render OpenAI-style messages the way the interpreter would have appended them
        (a system message whose content is None stands for the default system prompt)."""
        prompt = ""
        if messages and messages[0]["role"] != "system" and self.default_system_prompt:
            messages = [{"role": "system", "content": self.default_system_prompt}, *messages]
        rendered: list[dict[str, Any]] = []
        for message in messages:
            content = message["content"]
            if message["role"] == "system" and content is None:
                content = self.default_system_prompt
                if content is None:
                    continue
            prefix, suffix = self.get_prefix_and_suffix(message["role"], rendered)
            prompt += f"{prefix}{content}{suffix}"
            rendered.append({"role": message["role"], "content": content})
        return prompt
