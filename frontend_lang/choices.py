"""How `select` turns per-token prompt logprobs into a decision (SGLang's three scoring rules).

Every backend that can score returns, per choice, the logprob entries `[logprob, token_id, text]`
of `prefix + choice` from position `max(P - 2, 0)` on (P = prefix token count), the first entry
null. `score_choices` applies SGLang's normalisation and "token healing" correction, then the
method picks. Where SGLang would crash on a null entry (greedy and unconditional rules) a null
counts as 0.0: it is the same unconditioned position for every choice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LogprobEntry = list[Any]  # [logprob | None, token_id, text | None]


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] | None = None


class ChoicesSamplingMethod(ABC):
    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision: ...


def _argmax(values: list[float]) -> int:
    """First index of the maximum (numpy's tie rule)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def _lp(entry: LogprobEntry) -> float:
    return entry[0] if entry[0] is not None else 0.0


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob."""

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision:
        return ChoicesDecision(
            decision=choices[_argmax(normalized_prompt_logprobs)],
            meta_info={
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
            },
        )


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Token by token, keep the choices with the best logprob at that position; a shorter choice
    is padded with its own mean logprob so it can compete with longer ones."""

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision:
        width = max(len(entries) for entries in input_token_logprobs)
        matrix = []
        for entries in input_token_logprobs:
            row = [_lp(e) for e in entries]
            mean = sum(row) / len(row) if row else 0.0
            matrix.append(row + [mean] * (width - len(row)))
        remaining = list(range(len(choices)))
        for column in range(width):
            best = max(matrix[i][column] for i in remaining)
            remaining = [i for i in remaining if matrix[i][column] == best]
            if len(remaining) == 1:
                break
        return ChoicesDecision(
            decision=choices[remaining[0]],
            meta_info={
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
                "greedy_logprob_matrix": matrix,
            },
        )


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The choice whose tokens gain most over their likelihood without the prompt: the mean of
    (conditional - unconditional) logprob, the unconditional first entry counting as 0."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs, strict=True):
            diffs = [_lp(c) - _lp(u) for c, u in zip(cond, uncond, strict=True)]
            scores.append(sum(diffs) / len(diffs) if diffs else 0.0)
        return ChoicesDecision(
            decision=choices[_argmax(scores)],
            meta_info={
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
                "unconditional_token_logprobs": unconditional_token_logprobs,
                "normalized_unconditional_prompt_logprobs": scores,
            },
        )


class ConstrainedChoice(ChoicesSamplingMethod):
    """Not a scoring rule: `choices_method=constrained_choice` makes gen/select decode under a
    grammar of the choices (one generate request; `temperature` then samples among them)."""

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision:
        raise TypeError("constrained_choice decodes under a grammar; it does not score choices")


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
constrained_choice = ConstrainedChoice()


def logprob_start(prefix_tokens: int) -> int:
    """Where choice scoring starts: two tokens before the end of the prefix (token healing)."""
    return max(prefix_tokens - 2, 0)


def normalized_prompt_logprob(entries: list[LogprobEntry]) -> float:
    """Mean of the entries' logprobs, skipping falsy ones (null, and exactly 0.0) as SGLang does."""
    values = [e[0] for e in entries if e[0]]
    return sum(values) / len(values) if values else 0.0


def score_choices(
    prefix: str,
    choices: list[str],
    input_token_logprobs: list[list[LogprobEntry]],
    output_token_logprobs: list[list[LogprobEntry]],
    method: ChoicesSamplingMethod,
    unconditional: Callable[[list[list[int]]], list[list[LogprobEntry]]] | None = None,
) -> ChoicesDecision:
    """SGLang's select decision from the backend's per-choice logprob entries.

    `unconditional(list_of_token_id_lists)` returns the unconditional entries when the method
    needs them. Token healing: when the prefix text ends with the first entry's text, that entry
    is dropped (SGLang subtracts its logprob from the mean; ours is null, so the mean is unchanged).
    """
    entries = [list(e) for e in input_token_logprobs]
    normalized = [normalized_prompt_logprob(e) for e in entries]
    for i, row in enumerate(entries):
        first_text = row[0][2] if row and len(row[0]) > 2 else None
        if first_text and prefix.endswith(first_text) and len(row) > 1:
            if row[0][0]:
                normalized[i] = (normalized[i] * len(row) - row[0][0]) / (len(row) - 1)
            entries[i] = row[1:]
    uncond = None
    if method.requires_unconditional_logprobs:
        if unconditional is None:
            raise ValueError("this backend cannot compute unconditional logprobs")
        uncond = unconditional([[e[1] for e in row] for row in entries])
    return method(
        choices=choices,
        normalized_prompt_logprobs=normalized,
        input_token_logprobs=entries,
        output_token_logprobs=output_token_logprobs,
        unconditional_token_logprobs=uncond,
    )
