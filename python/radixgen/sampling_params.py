"""Per-request sampling parameters: parsing, normalisation and validation (no torch).

Runs in the API process (validation, before anything is allocated) and travels to the scheduler
inside `TokenizedGenerateReq`. Keys and defaults follow SGLang's `sampling_params` contract.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import regex

from radixgen.errors import InvalidRequestError
from radixgen.grammar_limits import GrammarSpecLimits, check_constraint, check_schema_object

TOP_K_DISABLED = 1 << 30
MAX_N = 128


@dataclass
class SamplingParams:
    """What to sample and when to stop. `None` and SGLang's sentinels are normalised away."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_DISABLED
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    choices: list[str] | None = None
    json_object: bool = False
    stream_interval: int | None = None

    # --- construction -------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls,
        params: Mapping[str, object] | SamplingParams | None,
        grammar_limits: GrammarSpecLimits | None = None,
    ) -> SamplingParams:
        """Build from a user dict; unknown keys and bad values raise `InvalidRequestError`.

        `grammar_limits`: the server's constraint size/depth limits (default: the flags' defaults).
        """
        if params is None:
            params = {}
        if isinstance(params, SamplingParams):
            return dataclasses.replace(params)
        if not isinstance(params, dict):
            raise InvalidRequestError("sampling_params must be an object", "sampling_params")
        known = {f.name for f in dataclasses.fields(cls)}
        # Any: the values are the user's, unchecked until normalize() (which the fields' own
        # types cannot express: a float max_new_tokens is accepted there and made an int)
        kwargs: dict[str, Any] = {}
        for key, value in params.items():
            key = _ALIASES.get(key, key)
            if key in _IGNORED_KEYS:
                continue
            if key not in known:
                raise InvalidRequestError(f"unknown sampling parameter '{key}'", key)
            if value is None:  # explicit nulls mean "use the default"
                continue
            kwargs[key] = value
        try:
            sp = cls(**kwargs)
        except TypeError as e:  # pragma: no cover - guarded by the key check above
            raise InvalidRequestError(str(e), "sampling_params") from e
        sp.normalize(grammar_limits)
        return sp

    def normalize(self, grammar_limits: GrammarSpecLimits | None = None) -> None:
        """Coerce types, apply SGLang's sentinels, then validate."""
        self.max_new_tokens = _as_int(self.max_new_tokens, "max_new_tokens")
        self.min_new_tokens = _as_int(self.min_new_tokens, "min_new_tokens")
        self.top_k = _as_int(self.top_k, "top_k")
        self.n = _as_int(self.n, "n")
        for name in (
            "temperature",
            "top_p",
            "min_p",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
        ):
            setattr(self, name, _as_float(getattr(self, name), name))
        if self.top_k in (-1, 0):
            self.top_k = TOP_K_DISABLED
        for name in (
            "ignore_eos",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "no_stop_trim",
            "json_object",
        ):
            if not isinstance(getattr(self, name), bool):
                _bad(name, f"must be true or false, got {getattr(self, name)!r}")
        for name in ("regex", "ebnf"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                _bad(name, f"must be a string, got {type(getattr(self, name)).__name__}")
        if self.json_schema is not None and not isinstance(self.json_schema, (str, dict)):
            _bad("json_schema", "must be a JSON Schema object or its JSON text")
        if self.stream_interval is not None:
            self.stream_interval = _as_int(self.stream_interval, "stream_interval")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        else:
            raise InvalidRequestError("stop must be a string or a list of strings", "stop")
        self.stop_regex = _stop_regexes(self.stop_regex)
        if isinstance(self.stop_token_ids, int):
            self.stop_token_ids = [self.stop_token_ids]
        self.stop_token_ids = [
            _as_int(t, "stop_token_ids") for t in _as_list(self.stop_token_ids, "stop_token_ids")
        ]
        if self.seed is not None:
            self.seed = _as_int(self.seed, "seed")
        limits = grammar_limits or GrammarSpecLimits()
        if isinstance(self.json_schema, (dict, list)):
            # NOTE: measured before json.dumps, whose recursion a deep object would overflow
            check_schema_object(self.json_schema, limits)
            self.json_schema = json.dumps(self.json_schema)
        if self.logit_bias:
            self.logit_bias = _parse_logit_bias(self.logit_bias)
        self.validate()
        if self.constraint is not None:
            check_constraint(*self.constraint, limits)

    def validate(self) -> None:
        """Reject values no engine could honour; message names the parameter."""
        if self.max_new_tokens < 0:
            _bad("max_new_tokens", f"must be >= 0, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            _bad("min_new_tokens", f"must be >= 0, got {self.min_new_tokens}")
        if self.min_new_tokens > self.max_new_tokens:
            _bad(
                "min_new_tokens",
                f"({self.min_new_tokens}) must not exceed max_new_tokens ({self.max_new_tokens})",
            )
        if not 0.0 <= self.temperature <= 100.0:
            _bad("temperature", f"must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            _bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < 1:
            _bad("top_k", f"must be -1 (disabled) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            _bad("min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                _bad(name, f"must be in [-2, 2], got {value}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            _bad("repetition_penalty", f"must be in (0, 2], got {self.repetition_penalty}")
        if not 1 <= self.n <= MAX_N:
            _bad("n", f"must be in [1, {MAX_N}], got {self.n}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                _bad("stop", "every stop string must be a non-empty string")
        if self.stream_interval is not None and self.stream_interval < 1:
            _bad("stream_interval", "must be >= 1")
        if self.choices is not None:
            if (
                not isinstance(self.choices, list)
                or not self.choices
                or not all(isinstance(c, str) and c for c in self.choices)
            ):
                _bad("choices", "must be a non-empty list of non-empty strings")
        kinds = [k for k in ("json_schema", "regex", "ebnf", "choices") if getattr(self, k)]
        if self.json_object:
            kinds.append("json_object")
        if len(kinds) > 1:
            _bad(kinds[1], f"only one constraint per request, got {', '.join(kinds)}")

    def verify_vocab(self, vocab_size: int) -> None:
        """Checks that need the model: token ids must exist."""
        for t in self.stop_token_ids:
            if not 0 <= t < vocab_size:
                _bad(
                    "stop_token_ids",
                    f"token id {t} is outside the vocabulary (0..{vocab_size - 1})",
                )
        for t in self.logit_bias:
            if not 0 <= t < vocab_size:
                _bad("logit_bias", f"token id {t} is outside the vocabulary (0..{vocab_size - 1})")

    # --- helpers ------------------------------------------------------------------------

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1

    @property
    def constraint(self) -> tuple[str, str] | None:
        """The grammar this request needs as (kind, spec), the key of the compile cache."""
        if self.json_schema is not None:
            return ("json_schema", self.json_schema)
        if self.regex is not None:
            return ("regex", self.regex)
        if self.ebnf is not None:
            return ("ebnf", self.ebnf)
        if self.choices is not None:
            return ("choices", json.dumps(self.choices))
        if self.json_object:
            return ("json_object", "")
        return None

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


_ALIASES = {"sampling_seed": "seed", "max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
# Accepted for compatibility with SGLang clients; it changes nothing here.
_IGNORED_KEYS = {"custom_params"}


def _bad(param: str, why: str) -> NoReturn:
    raise InvalidRequestError(f"{param} {why}", param)


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool):
        _bad(name, f"must be an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        _bad(name, f"must be an integer, got {value!r}")
    return value


def _as_float(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _bad(name, f"must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        _bad(name, f"must be finite, got {number}")
    return number


def _stop_regexes(value: object) -> list[str]:
    """stop_regex as a list of patterns that compile (with the `regex` module the scheduler
    matches with) and cannot match the empty text (such a pattern would end every request at
    its first token)."""
    if value == "":  # what a client that sets no pattern may send
        return []
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, (list, tuple)):
        _bad("stop_regex", "must be a regular expression or a list of them")
    for i, pattern in enumerate(patterns):
        if not isinstance(pattern, str) or not pattern:
            _bad("stop_regex", "every pattern must be a non-empty string")
        try:
            compiled = regex.compile(pattern)
        except (regex.error, RecursionError, OverflowError) as e:
            _bad("stop_regex", f"pattern {i} ({pattern!r}) is not a valid regular expression: {e}")
        if compiled.search("") is not None:
            _bad("stop_regex", f"pattern {i} ({pattern!r}) matches the empty text")
    return list(patterns)


def _as_list(value: object, name: str) -> list[object]:
    if not isinstance(value, (list, tuple)):
        _bad(name, f"must be a list, got {value!r}")
    return list(value)


def _parse_logit_bias(bias: object) -> dict[int, float]:
    if not isinstance(bias, dict):
        _bad("logit_bias", "must be an object mapping token ids to biases")
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            _bad("logit_bias", f"key {key!r} is not a token id")
        bias_value = _as_float(value, "logit_bias")
        if not -100.0 <= bias_value <= 100.0:
            _bad("logit_bias", f"bias for token {token} must be in [-100, 100]")
        out[token] = bias_value
    return out
