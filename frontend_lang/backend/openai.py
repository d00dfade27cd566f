"""OpenAI: programs against any OpenAI-compatible API (OpenAI itself, vLLM, SGLang, our /v1).

Chat models get the program's messages, so a gen must follow `assistant_begin()` (as in
SGLang). Completion models (`is_chat_model=False`) get the text with the chat template applied
here. `select` scores choices by echoed prompt logprobs on completion models (SGLang's rule,
one batched request). Chat APIs report logprobs of generated tokens only, so there a choice is
decoded under a constraint (the `regex` extension SGLang and RadixGen servers accept) or, where
the server refuses that, picked by the first generated token's top logprobs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixgen.lang.adapter_scope import current_adapter
from radixgen.lang.backend.base import BaseBackend, check_select_temperature
from radixgen.lang.chat_template import ChatTemplate, get_chat_template_by_model_path
from radixgen.lang.choices import ChoicesDecision, ChoicesSamplingMethod, score_choices
from radixgen.lang.errors import BackendError
from radixgen.lang.ir import SglSamplingParams

if TYPE_CHECKING:
    from radixgen.lang.executor import StreamExecutor

_DEFAULTS = {"top_k": -1, "min_p": 0.0, "min_new_tokens": 0, "ignore_eos": False}


class OpenAI(BaseBackend):
    def __init__(
        self,
        model_name: str,
        is_chat_model: bool | None = None,
        chat_template: ChatTemplate | None = None,
        is_azure: bool = False,
        chat_select: str = "auto",
        **openai_client_kwargs: Any,
    ) -> None:
        """`chat_select`: "constrained", "first_token_logprobs", or "auto" (constrained, then
        first-token logprobs if the server rejects the constraint)."""
        super().__init__()
        if chat_select not in ("auto", "constrained", "first_token_logprobs"):
            raise ValueError(f"unknown chat_select {chat_select!r}")
        self.chat_select = chat_select
        import openai

        self._openai = openai
        client_cls = openai.AzureOpenAI if is_azure else openai.OpenAI
        self.client = client_cls(**openai_client_kwargs)
        self.model_name = model_name
        self.chat_template = chat_template or get_chat_template_by_model_path(model_name)
        self.is_chat_model = True if is_chat_model is None else is_chat_model
        self.chat_prefix = self.chat_template.role_prefix_and_suffix["assistant"][0]
        self.can_echo_logprobs = not self.is_chat_model  # cleared when the server refuses

    def get_model_name(self) -> str:
        return self.model_name

    # --- request building ------------------------------------------------------------------

    def _prompt(self, s: StreamExecutor) -> dict[str, Any]:
        if not self.is_chat_model:
            return {"prompt": s.text_}
        if not s.text_.endswith(self.chat_prefix) or s.cur_role != "assistant":
            raise ValueError(
                "with an OpenAI chat model a gen/select must come right after "
                "assistant_begin() (or inside `with s.assistant():`); for free-form text "
                "use OpenAI(..., is_chat_model=False)"
            )
        return {"messages": s.messages_}

    def _kwargs(self, params: SglSamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model_name,
            "max_tokens": params.max_new_tokens,
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "frequency_penalty": params.frequency_penalty,
            "presence_penalty": params.presence_penalty,
        }
        stop = params.stop_list()
        if stop:
            kwargs["stop"] = stop[:4] if _is_openai_host(self.client) else stop
        extra: dict[str, object] = {}
        for key, name in (("top_k", "top_k"), ("min_p", "min_p"), ("ignore_eos", "ignore_eos"),
                          ("min_new_tokens", "min_tokens")):  # fmt: skip
            value = getattr(params, key)
            if value is not None and value != _DEFAULTS[key]:
                extra[name] = value
        if params.stop_token_ids:
            extra["stop_token_ids"] = list(params.stop_token_ids)
        if params.stop_regex:  # SGLang servers take it as an extra; others will refuse it
            extra["stop_regex"] = (
                [params.stop_regex]
                if isinstance(params.stop_regex, str)
                else list(params.stop_regex)
            )
        if params.regex is not None:
            extra["regex"] = params.regex
        if params.choices is not None:
            extra["regex"] = _choices_regex(params.choices)
        if params.json_schema is not None:
            schema = json.loads(params.json_schema)
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema},
            }
        if params.return_logprob:
            top = params.top_logprobs_num or 0
            if self.is_chat_model:
                kwargs["logprobs"] = True
                if top:
                    kwargs["top_logprobs"] = top
            else:
                kwargs["logprobs"] = top
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _create(self, stream: bool = False, **kwargs: Any) -> Any:
        """One API call; a call under a LoRA adapter names it as the `model` (SGLang's and
        vLLM's servers list their adapters as models)."""
        adapter = current_adapter()
        if adapter is not None:
            kwargs["model"] = adapter
        api = self.client.chat.completions if "messages" in kwargs else self.client.completions
        try:
            return api.create(stream=stream, **kwargs)
        except self._openai.APIStatusError as e:
            raise BackendError(f"{type(e).__name__}: {e.message}", e.status_code) from e
        except self._openai.APIConnectionError as e:
            raise BackendError(f"cannot reach the OpenAI-compatible server: {e}") from e

    # --- the interface ---------------------------------------------------------------------

    def generate(
        self, s: StreamExecutor, sampling_params: SglSamplingParams
    ) -> tuple[Any, dict[str, Any]]:
        ret = self._create(**self._prompt(s), **self._kwargs(sampling_params))
        texts = [_choice_text(c) for c in ret.choices]
        meta: dict[str, Any] = {
            "id": ret.id,
            "finish_reason": ret.choices[0].finish_reason,
            "prompt_tokens": ret.usage.prompt_tokens if ret.usage else None,
            "completion_tokens": ret.usage.completion_tokens if ret.usage else None,
        }
        if sampling_params.return_logprob:
            meta["output_token_logprobs"] = _output_logprobs(ret.choices[0])
        return (texts if len(texts) > 1 else texts[0]), meta

    def generate_stream(
        self, s: StreamExecutor, sampling_params: SglSamplingParams
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        kwargs = self._kwargs(sampling_params)
        if (sampling_params.n or 1) > 1:
            raise ValueError("streaming supports one sample (n=1)")
        for chunk in self._create(stream=True, **self._prompt(s), **kwargs):
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta.content if hasattr(choice, "delta") else choice.text
            meta = {"id": chunk.id, "finish_reason": choice.finish_reason}
            if sampling_params.return_logprob:
                meta["output_token_logprobs"] = _output_logprobs(choice)
            yield delta or "", meta

    def cache_prefix(self, prefix_str: str) -> None:
        """A prefill-only completion; chat APIs (and servers that refuse) cache by themselves."""
        if self.is_chat_model:
            return
        try:
            self._create(model=self.model_name, prompt=prefix_str, max_tokens=0)
        except BackendError:
            pass

    def select(
        self,
        s: StreamExecutor,
        choices: list[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        check_select_temperature(temperature)
        if self.can_echo_logprobs and not self.is_chat_model:
            try:
                return self._select_by_logprobs(s.text_, choices, choices_method)
            except BackendError as e:
                if e.status not in (400, 404, 422):
                    raise
                self.can_echo_logprobs = False  # the server cannot echo logprobs: constrain
        if self.chat_select != "first_token_logprobs":
            try:
                return self._select_by_constraint(s, choices)
            except BackendError as e:
                if self.chat_select == "constrained" or e.status not in (400, 422):
                    raise
                self.chat_select = "first_token_logprobs"  # no regex extension here
        return self._select_by_first_token(s, choices)

    def _select_by_logprobs(
        self, prefix: str, choices: list[str], method: ChoicesSamplingMethod
    ) -> ChoicesDecision:
        """One batched echo request; entries from two tokens before the prefix's end, the first
        one nulled, which is exactly what SGLang's select reads from /generate."""
        if method.requires_unconditional_logprobs:
            raise ValueError(
                "unconditional_likelihood_normalized needs token ids (native backends)"
            )
        ret = self._create(
            model=self.model_name, prompt=[prefix + c for c in choices], max_tokens=0,
            echo=True, logprobs=0, temperature=0,
        )  # fmt: skip
        by_index = sorted(ret.choices, key=lambda c: c.index)
        entries = []
        for choice in by_index:
            lp = choice.logprobs
            # tokens wholly inside the prefix; P of SGLang's rule when the boundary is stable
            ends = [off + len(tok) for off, tok in zip(lp.text_offset, lp.tokens, strict=True)]
            inside = sum(1 for end in ends if end <= len(prefix))
            start = max(inside - 2, 0)
            row = [
                [v, None, t]
                for v, t in zip(lp.token_logprobs[start:], lp.tokens[start:], strict=True)
            ]
            if row:
                row[0][0] = None
            entries.append(row)
        return score_choices(prefix, choices, entries, [[] for _ in choices], method)

    def _select_by_constraint(self, s: StreamExecutor, choices: list[str]) -> ChoicesDecision:
        params = SglSamplingParams(max_new_tokens=256, temperature=0.0, choices=list(choices))
        params.stop = list(s.chat_template.stop_str)
        text, meta = self.generate(s, params)
        text = text[0] if isinstance(text, list) else text
        picked = max(
            choices, key=lambda c: (text.startswith(c), len(c) if text.startswith(c) else 0)
        )
        if not text.startswith(picked):
            raise BackendError(f"the server ignored the choice constraint and answered {text!r}")
        return ChoicesDecision(decision=picked, meta_info={**meta, "method": "constrained"})

    def _select_by_first_token(self, s: StreamExecutor, choices: list[str]) -> ChoicesDecision:
        """One generated token with its top logprobs: each choice scores the best logprob of a
        listed token it starts with (or that starts with it); the best choice wins."""
        params = SglSamplingParams(max_new_tokens=1, temperature=0.0, return_logprob=True,
                                   top_logprobs_num=20)  # fmt: skip
        ret = self._create(**self._prompt(s), **self._kwargs(params))
        content = getattr(ret.choices[0].logprobs, "content", None) or []
        if not content:
            raise BackendError("the server returned no logprobs to choose among the choices")
        tops = [(t.token, t.logprob) for t in content[0].top_logprobs]
        scores = []
        for choice in choices:
            fits = [
                lp for tok, lp in tops if tok and (choice.startswith(tok) or tok.startswith(choice))
            ]
            scores.append(max(fits) if fits else float("-inf"))
        if max(scores) == float("-inf"):
            raise BackendError(f"no choice among the top tokens {[t for t, _ in tops]}")
        best = max(range(len(choices)), key=lambda i: (scores[i], -i))
        return ChoicesDecision(
            decision=choices[best], meta_info={"first_token_logprobs": scores, "method": "logprobs"}
        )

    def __repr__(self) -> str:
        return f"OpenAI({self.model_name!r})"


def _choices_regex(choices: list[str]) -> str:
    return "(" + "|".join(re.escape(c) for c in sorted(choices, key=len, reverse=True)) + ")"


def _choice_text(choice: Any) -> str:
    message = getattr(choice, "message", None)
    return (message.content or "") if message is not None else (choice.text or "")


def _output_logprobs(choice: Any) -> list[list[Any]]:
    """OpenAI logprobs as SGLang's `[logprob, token_id, text]` entries (ids are not reported)."""
    lp = getattr(choice, "logprobs", None)
    if lp is None:
        return []
    if getattr(lp, "content", None) is not None:
        return [[t.logprob, None, t.token] for t in lp.content]
    tokens = getattr(lp, "tokens", None) or []
    return [[v, None, t] for v, t in zip(lp.token_logprobs or [], tokens, strict=False)]


def _is_openai_host(client: object) -> bool:
    return "api.openai.com" in str(getattr(client, "base_url", ""))
