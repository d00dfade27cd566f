"""Which grammar backends may serve a constraint, best first, remembered per spec (scheduler process).

The configured backend comes first; for a JSON schema it cannot enforce exactly, the fallbacks
that can (schema_support's gap tables) follow, and a schema no backend enforces is refused by
keyword. Other kinds stay with the configured backend: every backend enforces them as given.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from radixgen.errors import GrammarError
from radixgen.runtime.constrained.compile_cache import GrammarKey
from radixgen.runtime.constrained.schema_checks import CheckPlan, serving_plan

# backends a request may fall back to, in order, when the configured one cannot serve it exactly
FALLBACK_BACKENDS = ("xgrammar", "llguidance")
# remembered choices (spec digest -> backends or their refusal), least recently used dropped;
# keyed by digest so that 4096 entries cost ~1 MB however large the specs are
CHOICE_CACHE_SIZE = 4096

# exact backends, best first; schema rewrites; the checked layer's plan (None: no checks)
_Choice = tuple[list[str], tuple[str, ...], CheckPlan | None]


class BackendChooser:
    """`choose(key)`: the exact backends for a constraint; `demote` after a failed compile."""

    def __init__(self, default: str, fallback: bool) -> None:
        self.order = [default]
        if fallback:
            self.order += [n for n in FALLBACK_BACKENDS if n != default]
        self._choices: OrderedDict[tuple[str, bytes], _Choice | GrammarError] = OrderedDict()

    @property
    def default(self) -> str:
        return self.order[0]

    def choose(self, key: GrammarKey) -> list[str]:
        """The backends that serve this constraint exactly, best first; none: a GrammarError."""
        return self.plan(key)[0]

    def plan(self, key: GrammarKey) -> _Choice:
        """`choose`, the schema rewrites the backends apply to it (meta_info), and the checks
        the scheduler runs on its outputs (schema_checks.py).

        A schema is parsed once per spec, on the scheduler thread (~1 ms per 100 kB).
        """
        digest = _digest(key)
        choice = self._choices.get(digest)
        if choice is None:
            kind, spec = key
            try:
                choice = (
                    serving_plan(spec, self.order)
                    if kind == "json_schema"
                    else (self.order[:1], (), None)
                )
            except GrammarError as e:
                choice = e
            self._remember(digest, choice)
        else:
            self._choices.move_to_end(digest)
        if isinstance(choice, GrammarError):
            raise choice
        return choice

    def demote(self, key: GrammarKey, remaining: list[str]) -> None:
        """Later requests of `key` start at `remaining` (its first backend failed to compile it)."""
        digest = _digest(key)
        known = self._choices.get(digest)
        rewrites, checks = (known[1], known[2]) if isinstance(known, tuple) else ((), None)
        self._remember(digest, (remaining, rewrites, checks))

    def _remember(self, digest: tuple[str, bytes], choice: _Choice | GrammarError) -> None:
        self._choices[digest] = choice
        if len(self._choices) > CHOICE_CACHE_SIZE:
            self._choices.popitem(last=False)


def _digest(key: GrammarKey) -> tuple[str, bytes]:
    kind, spec = key
    return kind, hashlib.blake2b(spec.encode(), digest_size=16).digest()
