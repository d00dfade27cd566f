"""Backends that speak SGLang's native /generate payloads: our HTTP server and the in-process Engine.

Subclasses only move a payload (`_post`, `_post_stream`) and count prompt tokens; everything a
program needs (gen, streaming, select scoring, prefix prefill) is written once here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixgen.lang.backend.base import BaseBackend, check_select_temperature
from radixgen.lang.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    logprob_start,
    score_choices,
)
from radixgen.lang.errors import BackendError
from radixgen.lang.global_config import global_config
from radixgen.lang.ir import SglSamplingParams

if TYPE_CHECKING:
    from radixgen.lang.executor import StreamExecutor


class NativeBackend(BaseBackend):
    def _post(self, payload: dict[str, Any]) -> Any:
        """One /generate call; a dict, or a list for a batch. Raises BackendError."""
        raise NotImplementedError

    def _post_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The chunks of a streaming /generate call (cumulative text, delta logprobs)."""
        raise NotImplementedError

    def count_prompt_tokens(self, text: str) -> int:
        """How many tokens `text` is as a prompt (select's logprob window starts from it)."""
        out = self._post({"text": text, "sampling_params": {"max_new_tokens": 0}})
        return int(out["meta_info"]["prompt_tokens"])

    # --- the interface --------------------------------------------------------------------

    def _payload(self, s: StreamExecutor, params: SglSamplingParams) -> dict[str, Any]:
        return {
            "text": s.text_,
            "sampling_params": {
                "skip_special_tokens": global_config.skip_special_tokens_in_output,
                "spaces_between_special_tokens": global_config.spaces_between_special_tokens_in_out,
                **params.to_native_dict(),
            },
            **params.logprob_options(),
        }

    def generate(
        self, s: StreamExecutor, sampling_params: SglSamplingParams
    ) -> tuple[Any, dict[str, Any]]:
        out = self._post(self._payload(s, sampling_params))
        if isinstance(out, list):  # n > 1: every sample, the first one continues the text
            for item in out:
                _raise_if_aborted(item)
            return [item["text"] for item in out], out[0]["meta_info"]
        _raise_if_aborted(out)
        return out["text"], out["meta_info"]

    def generate_stream(
        self, s: StreamExecutor, sampling_params: SglSamplingParams
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        if (sampling_params.n or 1) > 1:
            raise ValueError("streaming supports one sample (n=1)")
        payload = {**self._payload(s, sampling_params), "stream": True}
        pos = 0
        for chunk in self._post_stream(payload):
            if "error" in chunk:
                err = chunk["error"]
                message = err.get("message", err) if isinstance(err, dict) else err
                raise BackendError(
                    str(message), (err or {}).get("code") if isinstance(err, dict) else None
                )
            _raise_if_aborted(chunk)
            text = chunk["text"]
            yield text[pos:], chunk["meta_info"]
            pos = len(text)

    def cache_prefix(self, prefix_str: str) -> None:
        payload: dict[str, Any] = {"text": prefix_str, "sampling_params": {"max_new_tokens": 0}}
        if global_config.pin_cached_prefixes:
            payload["pin_prefix"] = True
        self._post(payload)

    def select(
        self,
        s: StreamExecutor,
        choices: list[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        """SGLang's scoring: logprobs of `prefix + choice` from two tokens before the end of the
        prefix. Batched, all choices go in one prefill request; when the prefix holds text the
        server has not processed yet, a prefill-only request caches it first (as SGLang does),
        else every choice would compute that text again. Unbatched, one request per choice
        (the measured baseline: the first one caches the prefix for the others)."""
        check_select_temperature(temperature)
        prefix = s.text_
        texts = [prefix + c for c in choices]
        if global_config.enable_batched_select:
            if len(prefix) > getattr(s, "server_seen", 0):
                prefill = self._post({"text": prefix, "sampling_params": {"max_new_tokens": 0}})
                start = logprob_start(int(prefill["meta_info"]["prompt_tokens"]))
            else:
                start = logprob_start(self.count_prompt_tokens(prefix))
            results = self._post(_scoring_payload(texts, start))
        else:
            start = logprob_start(self.count_prompt_tokens(prefix))
            results = [self._post(_scoring_payload(t, start)) for t in texts]
        for r in results:
            _raise_if_aborted(r)
        return score_choices(
            prefix,
            choices,
            [r["meta_info"]["input_token_logprobs"] for r in results],
            [r["meta_info"].get("output_token_logprobs", []) for r in results],
            choices_method,
            unconditional=self._unconditional_logprobs,
        )

    def _unconditional_logprobs(self, token_ids: list[list[int]]) -> list[list[Any]]:
        """Logprobs of each choice's tokens with no prompt before them (the first is null)."""
        out = self._post(
            {
                "input_ids": token_ids,
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": 0,
            }
        )
        return [r["meta_info"]["input_token_logprobs"] for r in out]


def _scoring_payload(text: str | list[str], start: int) -> dict[str, Any]:
    return {
        "text": text,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "return_text_in_logprobs": True,
        "logprob_start_len": start,
    }


def _raise_if_aborted(out: Any) -> None:
    reason = (out.get("meta_info") or {}).get("finish_reason") if isinstance(out, dict) else None
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise BackendError(str(reason.get("message", "request aborted")), reason.get("status_code"))
