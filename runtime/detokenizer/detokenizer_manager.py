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
from radixgen.io_struct import BatchStrOut, BatchTokenIDOut, TextDelta, TokenIDDelta
from radixgen.runtime.launch.process_utils import PortArgs, ReadyPipe, configure_child_process
from radixgen.runtime.text.stop_regex import (
    StopRegexTimeout,
    compile_patterns,
    held_back,
    match_start,
)
from radixgen.runtime.text.tokenizer import Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)

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
        deltas = batch.deltas
        errors: dict[int, Exception] = {}
        states: dict[int, DecodeState] = {}
        for i, d in enumerate(deltas):
            if d.rid in self.failed:
                continue
            try:
                states[i] = self._advance(d)
            except Exception as e:
                errors[i] = e
        try:
            self._decode(list(states.values()), [deltas[i].skip_special_tokens for i in states])
        except Exception:  # NOTE: find the request(s) it fails for: decode each alone
            for i in list(states):
                try:
                    self._decode([states[i]], [deltas[i].skip_special_tokens])
                except Exception as e:
                    errors[i] = e
                    del states[i]
        texts: dict[int, str] = {}
        for i, st in states.items():
            if i in errors:
                continue
            try:
                texts[i] = self._delta(deltas[i], st)
            except Exception as e:
                errors[i] = e
        return self._output(batch, texts, errors)

    def fail_batch(self, batch: BatchTokenIDOut, e: Exception) -> BatchStrOut:
        """After `handle` itself broke: every request of the batch fails with a 500 abort."""
        return self._output(batch, {}, dict.fromkeys(range(len(batch.deltas)), e))

    def _advance(self, d: TokenIDDelta) -> DecodeState:
        """Apply a request's rollback and new ids to its state (text is decoded afterwards)."""
        st = self.states.get(d.rid)
        if st is None:
            st = self.states[d.rid] = DecodeState(
                stop_strings=d.stop_strings, stop_regexes=compile_patterns(d.stop_regexes)
            )
        if d.rollback:
            self._rollback(st, d.rollback, d.skip_special_tokens)
        st.ids.extend(d.new_token_ids)
        finished = d.finished_reason
        if finished is not None and _trims_last_token(finished, d.no_stop_trim) and st.ids:
            st.ids.pop()  # a matched stop token id is not part of the text
            st.read_offset = min(st.read_offset, len(st.ids))
        return st

    def _delta(self, d: TokenIDDelta, st: DecodeState) -> str:
        """A request's new text to send (the final flush and stop-string trimming included)."""
        finished = d.finished_reason
        skip = d.skip_special_tokens
        if finished is not None and st.read_offset < len(st.ids):
            # the request ended inside a multi-byte character: flush it as it decodes
            full = self.tokenizer.decode(st.ids[st.prefix_offset :], skip)
            prefix = self.tokenizer.decode(st.ids[st.prefix_offset : st.read_offset], skip)
            st.text += full[len(prefix) :]
            st.read_offset = len(st.ids)
        end = len(st.text)
        stops, trim = st.stop_strings, not d.no_stop_trim
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
                    logger.warning("request %s: %s; its text is not held back", d.rid, e)
                    st.stop_regexes = []
            end -= held
        end = max(end, st.sent_len)
        delta = st.text[st.sent_len : end]
        st.sent_len = end
        if finished is not None:
            del self.states[d.rid]
        return delta

    def _output(
        self, batch: BatchTokenIDOut, texts: dict[int, str], errors: dict[int, Exception]
    ) -> BatchStrOut:
        """The text batch: decoded requests as they are, failed ones as a 500 abort."""
        out: list[TextDelta] = []
        for i, d in enumerate(batch.deltas):
            rid = d.rid
            finished = d.finished_reason
            if rid in self.failed:  # its scheduler side is still finishing: nothing to send
                if finished is not None:
                    self.failed.discard(rid)
                continue
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
                out.append(TextDelta(rid, "", [], finished, d.meta))
                continue
            out.append(
                TextDelta(
                    rid,
                    texts[i],
                    d.new_token_ids,
                    finished,
                    d.meta,
                    d.rollback,
                    d.output_token_logprobs,
                    d.output_top_logprobs,
                    d.input_token_logprobs,
                    d.input_top_logprobs,
                )
            )
        return BatchStrOut(out)

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
            logger.exception("failed to decode a batch of %d requests", len(msg.deltas))
            out = manager.fail_batch(msg, e)
        if out.deltas:
            send.send_pyobj(out)
