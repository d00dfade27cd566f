"""`--log-requests`: one log line per finished request, at SGLang's detail levels (API process).

Level 0: the request's id, its token counts, cached tokens, finish reason and latency; 1: and the
sampling parameters that differ from the defaults; 2: and the input and output text, each cut to
`PARTIAL_CHARS` (head and tail); 3: both whole. The line goes out when the request ends, whether
it finished, was aborted or its client left.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

from radixgen.io_struct import GenerateReqInput
from radixgen.runtime.request_side.req_state import ReqState
from radixgen.sampling_params import SamplingParams

logger = logging.getLogger("radixgen.requests")

PARTIAL_CHARS = 2048
_DEFAULTS = SamplingParams().to_dict()


class RequestLogger:
    def __init__(self, enabled: bool, level: int) -> None:
        self.enabled, self.level = enabled, level
        if enabled:  # asked for by name: written under a quieter --log-level too
            logger.setLevel(logging.INFO)

    def finished(self, item: GenerateReqInput, params: SamplingParams, st: ReqState) -> None:
        if self.enabled and not st.internal:
            logger.info("%s", json.dumps(self.record(item, params, st), ensure_ascii=False))

    def record(
        self, item: GenerateReqInput, params: SamplingParams, st: ReqState
    ) -> dict[str, object]:
        """The logged fields of one request (a JSON object: one greppable line)."""
        meta = st.meta
        end = st.finished_time or time.time()
        out: dict[str, object] = {
            "rid": st.rid,
            "prompt_tokens": st.prompt_tokens,
            "completion_tokens": meta.completion_tokens if meta else 0,
            "cached_tokens": meta.cached_tokens if meta else 0,
            "finish_reason": st.finish_reason.to_dict() if st.finish_reason else None,
            "e2e_latency_s": round(end - st.created, 4),
            "stream": st.stream,
        }
        if self.level >= 1:
            changed = {
                k: v
                for k, v in dataclasses.asdict(params).items()
                if k in _DEFAULTS and v != _DEFAULTS[k]
            }
            out["sampling_params"] = changed
        if self.level >= 2:
            prompt = item.text if item.text is not None else item.input_ids
            out["input"] = self._cut(prompt)
            out["output"] = self._cut(st.text)
        return out

    def _cut(self, value: str | list[str] | list[int] | list[list[int]] | None) -> object:
        """Whole at level 3; else a long text's head and tail (a long id list's too)."""
        if self.level >= 3 or value is None or len(value) <= PARTIAL_CHARS:
            return value
        half = PARTIAL_CHARS // 2
        skipped = len(value) - 2 * half
        if isinstance(value, str):
            return f"{value[:half]}...[{skipped} chars]...{value[-half:]}"
        return [*value[:half], f"...[{skipped} ids]...", *value[-half:]]
