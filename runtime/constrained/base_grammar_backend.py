"""The grammar backend contract: compile a (kind, spec) once, then hand each request its own matcher.

Runs in the scheduler process; `compile` runs on the grammar compile worker thread, everything
else on the scheduler thread. A backend wraps one library (xgrammar, outlines-core, llguidance);
the `GrammarManager` owns caching, timeouts, masks and jump-forward on top of this contract.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from radixgen.errors import GrammarError
from radixgen.runtime.constrained.grammar_spec import GRAMMAR_KINDS, clean_library_message, invalid

if TYPE_CHECKING:
    import torch

    from radixgen.runtime.constrained.vocab import GrammarVocab
    from radixgen.server_args import GrammarConfig

# Every backend must roll back at least this many tokens; jump-forward never goes further back.
MAX_ROLLBACK_TOKENS = 64


class BaseGrammarObject(ABC):
    """One request's position in its grammar. Every method runs on the scheduler thread."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) when the grammar forbids it."""

    def accept_tokens(self, token_ids: list[int]) -> int:
        """Advance token by token up to the first rejected one; returns how many were accepted."""
        for n, t in enumerate(token_ids):
            if not self.accept_token(t):
                return n
        return len(token_ids)

    @abstractmethod
    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into bitmask[row]; False when every token is allowed."""

    @abstractmethod
    def find_jump_forward_string(self) -> str:
        """The text the grammar forces next whatever the model picks ("" when there is a choice)."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token has been accepted: the request is done."""

    @abstractmethod
    def copy(self) -> BaseGrammarObject:
        """An independent matcher in the same state (parallel samples, n > 1)."""


class BaseGrammarBackend(ABC):
    """Compiles constraint specs for one model vocabulary and makes per-request matchers."""

    name: ClassVar[str]
    supported_kinds: ClassVar[frozenset[str]]
    # True when a compiled grammar can cross processes (serialize_compiled/deserialize_compiled):
    # then compiles run in killable worker processes; otherwise on threads of this process
    compiles_in_worker_process: ClassVar[bool] = False
    # what one cached compile is assumed to hold when the library cannot say (see compiled_size_bytes)
    estimated_compiled_bytes: ClassVar[int] = 1024 * 1024

    def __init__(self, vocab: GrammarVocab, config: GrammarConfig) -> None:
        self.vocab = vocab
        self.config = config

    def check_kind(self, kind: str) -> None:
        """Refuse kinds this backend cannot enforce, instead of silently ignoring them."""
        if kind not in GRAMMAR_KINDS:
            raise GrammarError(f"unknown constraint kind '{kind}'", kind)
        if kind not in self.supported_kinds:
            can = ", ".join(k for k in GRAMMAR_KINDS if k in self.supported_kinds)
            raise GrammarError(
                f"the {self.name} grammar backend does not support {kind} constraints "
                f"(it supports {can}); serve with --grammar-backend xgrammar or llguidance for all kinds",
                kind,
            )

    def compile(self, kind: str, spec: str) -> Any:
        """Compile on the worker thread; any failure becomes a GrammarError naming the kind."""
        self.check_kind(kind)
        try:
            return self._compile(kind, spec)
        except GrammarError:
            raise
        except Exception as e:  # the libraries raise RuntimeError, ValueError, TypeError...
            raise invalid(kind, clean_library_message(e)) from None

    @abstractmethod
    def _compile(self, kind: str, spec: str) -> Any:
        """The library's compiled form of the spec (kept in the shared compile cache)."""

    @abstractmethod
    def create_grammar(self, compiled: Any) -> BaseGrammarObject:
        """A fresh matcher at the start of a compiled grammar (cheap: runs per request)."""

    def serialize_compiled(self, compiled: Any) -> str:
        """The compiled grammar as text (in the compile worker), for `deserialize_compiled`."""
        raise NotImplementedError(f"{self.name} compiles cannot cross processes")

    def deserialize_compiled(self, payload: str) -> Any:
        """The compiled grammar back from `serialize_compiled` (in the scheduler process)."""
        raise NotImplementedError(f"{self.name} compiles cannot cross processes")

    def compiled_size_bytes(self, compiled: Any) -> int:
        """Memory a compiled grammar holds, for the cache's byte budget (an estimate by default)."""
        return self.estimated_compiled_bytes

    def fill_bitmask(self, grammars: list[BaseGrammarObject], bitmask: torch.Tensor) -> list[bool]:
        """Fill bitmask[i] for grammars[i]; returns per row whether the mask restricts anything."""
        return [g.fill_next_token_bitmask(bitmask, i) for i, g in enumerate(grammars)]

    def shutdown(self) -> None:
        """Release library resources (thread pools); the backend is unusable afterwards."""
        return None
