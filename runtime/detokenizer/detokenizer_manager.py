"""Incremental detokenization (detokenizer process): token ids in, text deltas out.

A streamed piece never ends in a broken UTF-8 character (text ending in U+FFFD is held back until
the next token completes it), never shows the start of a possible stop string or stop_regex
match, and the matched stop string (or match) is trimmed from the final text. Each incoming batch
is decoded with two batched `decode_batch` calls, not one call per request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import regex

from radixgen.finish_reason import FinishReason
from radixgen.io_struct import BatchStrOut, BatchTokenIDOut
from radixgen.runtime.launch.process_utils import PortArgs, ReadyPipe, configure_child_process
from radixgen.runtime.text.stop_regex import (
    StopRegexTimeout,
    compile_patterns,
    held_back,
    match_start,
)
from radixgen.runtime.text.tokenizer import Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)

_LOGPROB_FIELDS = (
    "output_token_logprobs",
    "output_top_logprobs",
    "input_token_logprobs",
    "input_top_logprobs",
)

# How many already-emitted tokens to re-decode as context: byte-level BPE pieces and
# sentencepiece's leading-space rule both need a little left context to decode a suffix.
_CONTEXT_TOKENS = 5


@dataclass
class DecodeState:
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0  # start of the context window
    read_offset: int = 0  # tokens whose text is in `text`
    text: str = ""  # decoded text of ids[:read_offset] (may hold back held text below)
    sent_len: int = 0  # chars of `text` already sent
    stop_strings: list[str] = field(default_factory=list)  # from the request's first message
    stop_regexes: list[regex.Pattern[str]] = field(default_factory=list)  # the same


class DetokenizerManager:
    """Per-request decode state; `handle` turns one token batch into one text batch.

    NOTE: containment. An exception while decoding one request fails that request (a 500 abort
    with no text) and only it; until the scheduler's own final output for it arrives (the API
    process aborts it there), its later outputs are dropped.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, DecodeState] = {}
        self.failed: set[str] = set()  # rids failed here whose scheduler side still runs

    def handle(self, batch: BatchTokenIDOut) -> BatchStrOut:
        errors: dict[int, Exception] = {}
        states: dict[int, DecodeState] = {}
        for i, rid in enumerate(batch.rids):
            if rid in self.failed:
                continue
            try:
                states[i] = self._advance(batch, i)
            except Exception as e:
                errors[i] = e
        try:
            self._decode(list(states.values()), [batch.skip_special_tokens[i] for i in states])
        except Exception:  # NOTE: find the request(s) it fails for: decode each alone
            for i in list(states):
                try:
                    self._decode([states[i]], [batch.skip_special_tokens[i]])
                except Exception as e:
                    errors[i] = e
                    del states[i]
        deltas: dict[int, str] = {}
        for i, st in states.items():
            if i in errors:
                continue
            try:
                deltas[i] = self._delta(batch, i, st)
            except Exception as e:
                errors[i] = e
        return self._output(batch, deltas, errors)

    def fail_batch(self, batch: BatchTokenIDOut, e: Exception) -> BatchStrOut:
        """After `handle` itself broke: every request of the batch fails with a 500 abort."""
        return self._output(batch, {}, dict.fromkeys(range(len(batch.rids)), e))

    def _advance(self, batch: BatchTokenIDOut, i: int) -> DecodeState:
        """Apply request i's rollback and new ids to its state (text is decoded afterwards)."""
        rid = batch.rids[i]
        st = self.states.get(rid)
        if st is None:
            patterns = batch.stop_regexes[i] if i < len(batch.stop_regexes) else []
            st = self.states[rid] = DecodeState(
                stop_strings=batch.stop_strings[i], stop_regexes=compile_patterns(patterns)
            )
        rollback = batch.rollbacks[i]
        if rollback:
            self._rollback(st, rollback, batch.skip_special_tokens[i])
        st.ids.extend(batch.new_token_ids[i])
        finished = batch.finished_reasons[i]
        if finished is not None and _trims_last_token(finished, batch.no_stop_trim[i]) and st.ids:
            st.ids.pop()  # a matched stop token id is not part of the text
            st.read_offset = min(st.read_offset, len(st.ids))
        return st

    def _delta(self, batch: BatchTokenIDOut, i: int, st: DecodeState) -> str:
        """Request i's new text to send (the final flush and stop-string trimming included)."""
        finished = batch.finished_reasons[i]
        skip = batch.skip_special_tokens[i]
        if finished is not None and st.read_offset < len(st.ids):
            # the request ended inside a multi-byte character: flush it as it decodes
            full = self.tokenizer.decode(st.ids[st.prefix_offset :], skip)
            prefix = self.tokenizer.decode(st.ids[st.prefix_offset : st.read_offset], skip)
            st.text += full[len(prefix) :]
            st.read_offset = len(st.ids)
        end = len(st.text)
        stops, trim = st.stop_strings, not batch.no_stop_trim[i]
        if finished is not None:
            matched = finished.matched_stop_string
            pattern = finished.matched_stop_regex
            if matched is not None and trim:
                pos = st.text.find(matched)
                if pos != -1:
                    end = pos
            elif pattern is not None and trim:
                start = match_start(st.text, pattern)
                if start is not None:
                    end = start
        else:
            held = _held_back(st.text, stops) if stops else 0
            if st.stop_regexes and trim:
                try:
                    held = max(held, held_back(st.text, st.stop_regexes))
                except StopRegexTimeout as e:  # NOTE: once; never again for this request
                    logger.warning("request %s: %s; its text is not held back", batch.rids[i], e)
                    st.stop_regexes = []
            end -= held
        end = max(end, st.sent_len)
        delta = st.text[st.sent_len : end]
        st.sent_len = end
        if finished is not None:
            del self.states[batch.rids[i]]
        return delta

    def _output(
        self, batch: BatchTokenIDOut, deltas: dict[int, str], errors: dict[int, Exception]
    ) -> BatchStrOut:
        """The text batch: decoded requests as they are, failed ones as a 500 abort."""
        out = BatchStrOut([], [], [], [], [], [], [], [], [], [])
        for i, rid in enumerate(batch.rids):
            finished = batch.finished_reasons[i]
            if rid in self.failed:  # its scheduler side is still finishing: nothing to send
                if finished is not None:
                    self.failed.discard(rid)
                continue
            new_ids = batch.new_token_ids[i]
            if i in errors:
                e = errors[i]
                logger.error(
                    "failed to decode request %s: %r",
                    rid,
                    e,
                    exc_info=(type(e), e, e.__traceback__),
                )
                self.states.pop(rid, None)
                if finished is None:
                    self.failed.add(rid)
                finished = FinishReason.abort(f"internal error in the detokenizer: {e!r}", 500)
                delta, new_ids = "", []
            else:
                delta = deltas[i]
            out.rids.append(rid)
            out.delta_texts.append(delta)
            out.new_token_ids.append(new_ids)
            out.finished_reasons.append(finished)
            out.metas.append(batch.metas[i])
            out.rollbacks.append(batch.rollbacks[i] if i not in errors else 0)
            for name in _LOGPROB_FIELDS:
                values = getattr(batch, name)
                getattr(out, name).append(values[i] if values and i not in errors else None)
        return out

    def _decode(self, states: list[DecodeState], skip_special: list[bool]) -> None:
        """Advance every state's text by the ids it has not decoded yet (two batched calls)."""
        by_flag: dict[bool, list[int]] = {}
        for i, st in enumerate(states):
            if st.read_offset < len(st.ids):
                by_flag.setdefault(skip_special[i], []).append(i)
        for flag, idx in by_flag.items():
            prefix = self.tokenizer.decode_batch(
                [states[i].ids[states[i].prefix_offset : states[i].read_offset] for i in idx], flag
            )
            full = self.tokenizer.decode_batch(
                [states[i].ids[states[i].prefix_offset :] for i in idx], flag
            )
            for j, i in enumerate(idx):
                st = states[i]
                new_text = full[j]
                if len(new_text) > len(prefix[j]) and not new_text.endswith("\ufffd"):
                    st.text += new_text[len(prefix[j]) :]
                    st.read_offset = len(st.ids)
                    st.prefix_offset = max(0, st.read_offset - _CONTEXT_TOKENS)

    def _rollback(self, st: DecodeState, n: int, skip_special: bool) -> None:
        """Drop the last n token ids (jump-forward retokenized them); the text is re-derived.

        The replacement tokens decode to the same text plus more, so text already sent stays a
        prefix of the new text and nothing is sent twice.
        """
        del st.ids[len(st.ids) - n :]
        st.text = self.tokenizer.decode(st.ids, skip_special_tokens=skip_special)
        while st.text.endswith("\ufffd"):
            st.text = st.text[:-1]
        st.read_offset = len(st.ids)
        st.prefix_offset = max(0, st.read_offset - _CONTEXT_TOKENS)


def _trims_last_token(finished: FinishReason, no_stop_trim: bool) -> bool:
    return finished.matched_token_id is not None and not no_stop_trim


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def run_detokenizer_process(
    model_folder: str,
    tokenizer_path: str | None,
    chat_template: str | None,
    ports: PortArgs,
    ready_pipe: ReadyPipe,
    log_level: str,
) -> None:
    """Entry point of the detokenizer process."""
    import zmq

    configure_child_process("detokenizer", log_level)
    try:
        manager = DetokenizerManager(load_tokenizer(model_folder, tokenizer_path, chat_template))
        ctx = zmq.Context(1)
        recv = ctx.socket(zmq.PULL)
        recv.bind(ports.detokenizer_ipc)
        send = ctx.socket(zmq.PUSH)
        send.connect(ports.tokenizer_ipc)
    except Exception as e:
        ready_pipe.send({"status": "error", "error": repr(e)})
        raise
    ready_pipe.send({"status": "ready"})
    ready_pipe.close()
    while True:
        msg = recv.recv_pyobj()
        if not isinstance(msg, BatchTokenIDOut):  # control replies pass through untouched
            send.send_pyobj(msg)
            continue
        try:
            out = manager.handle(msg)
        except Exception as e:  # NOTE: the loop must survive; fail this batch's requests only
            logger.exception("failed to decode a batch of %d requests", len(msg.rids))
            out = manager.fail_batch(msg, e)
        if out.rids:
            send.send_pyobj(out)
