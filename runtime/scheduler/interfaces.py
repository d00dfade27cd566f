"""What the scheduler needs of its collaborators, as Protocols (scheduler process).

The scheduler is built with a model runner, a tokenizer, a prefix cache and a grammar manager
(see `scheduler_process.build_scheduler`); typing the first two as Protocols lets tests plan and
step real requests over real KV pools with a fake forward that costs microseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.model_executor.logits_output import LogitsOutput


class StepRunner(Protocol):
    """Owns the KV pools the scheduler plans over and runs one forward step over them."""

    @property
    def kv_pool(self) -> TokenToKVPool: ...

    @property
    def req_to_token_pool(self) -> ReqToTokenPool: ...

    def forward(self, batch: ForwardBatch) -> LogitsOutput: ...


class TextDecoder(Protocol):
    """Token ids -> text, for the stop-string check."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...
