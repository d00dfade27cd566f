"""Helpers shared by the grammar tests (imported by module name; pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from radixgen.grammar_limits import GrammarSpecLimits
from radixgen.io_struct import TokenizedGenerateReq
from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarObject
from radixgen.runtime.scheduler.req import Req
from radixgen.sampling_params import SamplingParams

VOCAB_SIZE = 49152
EOS = 2
SPECIAL_IDS = [0, 1, *range(3, 17)]  # every added token except EOS
BACKENDS = ["xgrammar", "outlines", "llguidance"]


# limits that let any spec through the API-side check (to test the scheduler's own handling)
NO_LIMITS = GrammarSpecLimits(max_depth=1 << 30, max_spec_bytes=1 << 40)


def make_req(
    rid: str,
    prompt_ids: list[int] | None = None,
    limits: GrammarSpecLimits | None = None,
    **sampling: Any,
) -> Req:
    """A scheduler request (not admitted anywhere) with the given sampling params."""
    params = SamplingParams.from_dict(sampling, limits)
    msg = TokenizedGenerateReq(rid, prompt_ids or [1, 2, 3], params, arrival_time=time.time())
    return Req(msg, 0)


def allowed_ids(bitmask: torch.Tensor, row: int = 0) -> set[int]:
    """Token ids whose bit is set in bitmask[row]."""
    bits = (bitmask[row].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return set(torch.nonzero(bits.flatten()).flatten().tolist())


def is_allowed(bitmask: torch.Tensor, token_id: int, row: int = 0) -> bool:
    return bool((int(bitmask[row, token_id // 32]) >> (token_id % 32)) & 1)


def mask_of(grammar: BaseGrammarObject) -> torch.Tensor:
    bitmask = torch.zeros((1, (VOCAB_SIZE + 31) // 32), dtype=torch.int32)
    grammar.fill_next_token_bitmask(bitmask, 0)
    return bitmask


def spec_text(kind: str, spec: Any) -> str:
    """The (kind, spec) cache-key form the scheduler sends: JSON text for schemas and choices."""
    if kind in ("json_schema", "choices") and not isinstance(spec, str):
        return json.dumps(spec)
    return "" if spec is None else spec


def nested_array_schema(depth: int) -> dict[str, Any]:
    """Arrays of arrays `depth` deep (JSON depth depth + 1): compile time grows steeply with it
    (xgrammar here: depth 100 ~0.2 s, 400 ~5 s, 900 ~70 s and ~10 GB)."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema
