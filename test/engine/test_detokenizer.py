"""Incremental detokenization on the default model's byte-level vocabulary: a streamed piece never
ends inside a UTF-8 character, and the pieces add up to the full text."""

from __future__ import annotations

import pytest

from radixgen.finish_reason import FinishReason
from radixgen.io_struct import BatchTokenIDOut, TokenIDDelta
from radixgen.runtime.detokenizer.detokenizer_manager import DetokenizerManager
from radixgen.runtime.model_loader import resolve_model_path
from radixgen.runtime.text.tokenizer import Tokenizer, _bytes_to_unicode

TEXT = "Crabs 🦀 like 日本語 and ünïcödé"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(resolve_model_path(None))


def _batch(rid: str, ids: list[int], finished: FinishReason | None) -> BatchTokenIDOut:
    return BatchTokenIDOut([_delta(rid, ids, finished)])


def _delta(rid: str, ids: list[int], finished: FinishReason | None) -> TokenIDDelta:
    return TokenIDDelta(
        rid=rid, rollback=0, new_token_ids=ids, finished_reason=finished, meta=None,
        skip_special_tokens=True, spaces_between_special_tokens=True, no_stop_trim=False,
        stop_strings=[],
    )  # fmt: skip


@pytest.mark.parametrize("spelling", ["bpe", "bytes"])
def test_streamed_pieces_are_whole_characters(tokenizer, spelling):
    if spelling == "bpe":
        ids = tokenizer.encode(TEXT)
    else:  # every UTF-8 byte as its own token: multi-byte characters span several tokens
        table = _bytes_to_unicode()
        ids = [tokenizer.token_to_id(table[b]) for b in TEXT.encode("utf-8")]
    assert tokenizer.decode(ids) == TEXT
    detok = DetokenizerManager(tokenizer)
    pieces = []
    for i, tok in enumerate(ids):
        done = FinishReason.length(len(ids)) if i == len(ids) - 1 else None
        pieces.append(detok.handle(_batch(spelling, [tok], done)).deltas[0].text)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == TEXT
    if spelling == "bytes":
        assert any(p == "" for p in pieces)  # partial characters were held back, not sent


def test_stop_strings_travel_once_and_the_detokenizer_keeps_them(tokenizer):
    """The scheduler sends a request's stop strings with its first message only; later chunks
    carry none, yet the detokenizer still holds back a possible stop prefix and trims the match."""
    from radixgen.io_struct import TokenizedGenerateReq
    from radixgen.runtime.scheduler.output_processor import collect_outputs
    from radixgen.runtime.scheduler.req import Req
    from radixgen.sampling_params import SamplingParams

    sp = SamplingParams(stop=["STOP here"])
    req = Req(TokenizedGenerateReq("s", [1, 2], sp, stream=True), default_seed=0)
    detok = DetokenizerManager(tokenizer)
    chunks = [
        tokenizer.encode(t, add_special_tokens=False) for t in ("Hello world", " STO", "P here")
    ]
    pieces, sent_stops = [], []
    for step, chunk in enumerate(chunks):
        req.output_ids.extend(chunk)
        req.steps_since_stream = 1
        if step == len(chunks) - 1:
            req.finish(FinishReason.stop("STOP here"))
        (msg,) = collect_outputs([req], stream_interval=1).messages
        sent_stops.append(msg.deltas[0].stop_strings)
        pieces.append(detok.handle(msg).deltas[0].text)
    assert sent_stops == [["STOP here"], [], []]
    # "STO" could still grow into the stop string: held back though the message had no stops
    assert pieces[:2] == ["Hello world", " "]
    assert "".join(pieces) == "Hello world "
    assert "s" not in detok.states


def test_a_request_that_fails_to_decode_fails_alone_and_its_later_outputs_are_dropped(tokenizer):
    """A token id no tokenizer can decode (a bug upstream) fails that request with a 500 abort;
    the batch's other request decodes as usual, and so do later batches."""
    good = tokenizer.encode("Hello there, world")
    detok = DetokenizerManager(tokenizer)

    def batch(bad_ids: list[int], good_ids: list[int], finished: FinishReason | None):
        return BatchTokenIDOut(
            [_delta("bad", bad_ids, finished), _delta("good", good_ids, finished)]
        )

    first = detok.handle(batch([good[0], -1], good[:2], None))
    assert [d.rid for d in first.deltas] == ["bad", "good"]
    reason = first.deltas[0].finished_reason
    assert reason.is_abort and reason.status_code == 500 and "detokenizer" in reason.message
    assert first.deltas[0].text == "" and first.deltas[1].finished_reason is None
    # the scheduler still streams the failed request until the API's abort reaches it
    second = detok.handle(batch([good[1]], good[2:], None))
    assert [d.rid for d in second.deltas] == ["good"]
    last = detok.handle(batch([], [], FinishReason.abort("aborted by the client", 499)))
    assert [d.rid for d in last.deltas] == ["good"]
    text = first.deltas[1].text + second.deltas[0].text + last.deltas[0].text
    assert text == tokenizer.decode(good)
    assert not detok.states and not detok.failed
