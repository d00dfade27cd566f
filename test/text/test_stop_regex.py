"""stop_regex without a server: validation (400s that name the pattern), the scheduler's finish
check on the default model's real tokenizer (incremental text, anchors, the step it stops at, a
catastrophic pattern ending only its request), and the detokenizer's hold-back and trim."""

from __future__ import annotations

import pytest

from radixgen.errors import InvalidRequestError
from radixgen.finish_reason import FinishReason
from radixgen.io_struct import TokenizedGenerateReq
from radixgen.runtime.model_loader import resolve_model_path
from radixgen.runtime.request_side.request_limits import RequestLimits
from radixgen.runtime.scheduler.finish import check_finish
from radixgen.runtime.scheduler.req import Req
from radixgen.runtime.text.stop_regex import compile_patterns, held_back, match_start
from radixgen.runtime.text.tokenizer import Tokenizer
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import LimitsConfig


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(resolve_model_path(None))


# --- validation ----------------------------------------------------------------------------------


def test_patterns_are_normalised_to_a_list_and_empty_values_mean_none():
    assert SamplingParams.from_dict({"stop_regex": r"\d+"}).stop_regex == [r"\d+"]
    assert SamplingParams.from_dict({"stop_regex": ["a", "b+"]}).stop_regex == ["a", "b+"]
    for empty in (None, "", []):
        assert SamplingParams.from_dict({"stop_regex": empty}).stop_regex == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("(unclosed", r"pattern 0 \('\(unclosed'\) is not a valid regular expression: missing \)"),
        (["ok", "[a-"], r"pattern 1 \('\[a-'\) is not a valid regular expression"),
        ("a*", r"pattern 0 \('a\*'\) matches the empty text"),
        (["x", ""], "every pattern must be a non-empty string"),
        (7, "must be a regular expression or a list of them"),
    ],
)
def test_bad_patterns_are_refused_naming_the_pattern(value, message):
    with pytest.raises(InvalidRequestError, match=message) as err:
        SamplingParams.from_dict({"stop_regex": value})
    assert err.value.param == "stop_regex" and err.value.status_code == 400


def test_the_stop_string_limits_bound_stop_regex_too():
    limits = RequestLimits(LimitsConfig(max_stop_strings=2, max_stop_string_chars=4))
    limits.check_stop_regexes(["abcd", "e"])
    with pytest.raises(
        InvalidRequestError, match=r"3 patterns; the limit is 2 \(--max-stop-strings"
    ):
        limits.check_stop_regexes(["a", "b", "c"])
    with pytest.raises(InvalidRequestError, match=r"pattern 1 has 5 characters; the limit is 4"):
        limits.check_stop_regexes(["a", "abcde"])


# --- the scheduler's finish check ----------------------------------------------------------------


def _req(**params) -> Req:
    sp = SamplingParams.from_dict({"max_new_tokens": 64, **params})
    return Req(TokenizedGenerateReq("r", [1, 2], sp), default_seed=0)


def _generate(req: Req, tokenizer: Tokenizer, pieces: list[str]) -> int | None:
    """Append each piece's tokens one by one, checking after each; the piece it stopped in."""
    for i, piece in enumerate(pieces):
        for tok in tokenizer.encode(piece, add_special_tokens=False):
            req.output_ids.append(tok)
            check_finish(req, [], 2048, tokenizer)
            if req.finished:
                return i
    return None


def test_the_request_stops_at_the_token_that_completes_a_match(tokenizer):
    req = _req(stop_regex=[r"\[\d+\]", "never"])
    stopped_in = _generate(req, tokenizer, ["Result", " [4", "2]", " more text"])
    assert stopped_in == 2
    assert req.finished_reason == FinishReason.stop_regex(r"\[\d+\]")
    assert req.finished_reason.to_dict() == {"type": "stop", "matched": r"\[\d+\]"}
    assert req.finished_reason.matched_stop_string is None  # not trimmed as a literal string


def test_anchors_and_lookbehinds_see_the_whole_output(tokenizer):
    # `^` is the start of the output, not of a tail window: "Hi" later in the text is no match
    req = _req(stop_regex=r"^Hi")
    assert _generate(req, tokenizer, ["Oh", " Hi", " there"]) is None
    req = _req(stop_regex=r"(?<=total: )\d")
    assert _generate(req, tokenizer, ["the total", ": ", "5 apples"]) == 2


def test_min_new_tokens_defers_the_check(tokenizer):
    ids = tokenizer.encode("a1 b2 c3 d4", add_special_tokens=False)
    req = _req(stop_regex=r"\d", min_new_tokens=len(ids))
    for tok in ids[:-1]:
        req.output_ids.append(tok)
        check_finish(req, [], 2048, tokenizer)
        assert not req.finished
    req.output_ids.append(ids[-1])
    check_finish(req, [], 2048, tokenizer)
    assert req.finished_reason == FinishReason.stop_regex(r"\d")


def test_a_catastrophic_pattern_ends_its_request_with_a_400(tokenizer):
    req = _req(stop_regex=r"(a|aa)+c$")
    req.output_ids.extend(tokenizer.encode("a" * 60 + "b", add_special_tokens=False))
    check_finish(req, [], 2048, tokenizer)
    reason = req.finished_reason
    assert reason is not None and reason.is_abort and reason.status_code == 400
    assert "(a|aa)+c$" in reason.message and "simplify the pattern" in reason.message


# --- the detokenizer's hold-back and trim --------------------------------------------------------


def test_held_back_starts_where_a_match_may_still_begin():
    patterns = compile_patterns([r"\[\d+\]", "END"])
    assert held_back("Result [4", patterns) == 2
    assert held_back("Result EN", patterns) == 2
    assert held_back("Result [4] x", patterns) == 0  # a whole match it did not stop on
    assert held_back("plain text", patterns) == 0
    assert match_start("Result [42] more", r"\[\d+\]") == 7
    assert match_start("nothing", r"\[\d+\]") is None


@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_streamed_pieces_never_show_text_the_final_answer_trims(tokenizer, no_stop_trim):
    """Scheduler output -> detokenizer, as streamed: the patterns travel with the first message
    only; a possible match is held back, and the match is cut from the final text (unless
    no_stop_trim, which streams everything and keeps the match)."""
    from radixgen.runtime.detokenizer.detokenizer_manager import DetokenizerManager
    from radixgen.runtime.scheduler.output_processor import collect_outputs

    pattern = r"\[\d+\]"
    sp = SamplingParams.from_dict({"stop_regex": pattern, "no_stop_trim": no_stop_trim})
    req = Req(TokenizedGenerateReq("s", [1, 2], sp, stream=True), default_seed=0)
    detok = DetokenizerManager(tokenizer)
    pieces, sent_patterns = [], []
    for text in ("Result", " [4", "2]"):
        for tok in tokenizer.encode(text, add_special_tokens=False):
            req.output_ids.append(tok)
            check_finish(req, [], 2048, tokenizer)
        req.steps_since_stream = 1
        (msg,) = collect_outputs([req], stream_interval=1).messages
        sent_patterns.append(msg.deltas[0].stop_regexes)
        pieces.append(detok.handle(msg).deltas[0].text)
    assert req.finished_reason == FinishReason.stop_regex(pattern)
    assert sent_patterns == [[pattern], [], []]
    if no_stop_trim:
        assert pieces == ["Result", " [4", "2]"]
    else:
        assert pieces == ["Result", " ", ""]  # "[4" could grow into a match: never sent
    assert "s" not in detok.states


def test_a_catastrophic_pattern_stops_being_held_back_in_the_detokenizer(tokenizer):
    from radixgen.io_struct import BatchTokenIDOut, TokenIDDelta
    from radixgen.runtime.detokenizer.detokenizer_manager import DetokenizerManager
    from radixgen.runtime.text.stop_regex import StopRegexTimeout

    pattern = r"(a|aa)+c$"
    text = "a" * 60 + "b"
    with pytest.raises(StopRegexTimeout, match="simplify the pattern"):
        held_back(text, compile_patterns([pattern]))
    detok = DetokenizerManager(tokenizer)
    batch = BatchTokenIDOut([
        TokenIDDelta(
            rid="r", rollback=0, new_token_ids=tokenizer.encode(text, add_special_tokens=False),
            finished_reason=None, meta=None, skip_special_tokens=True,
            spaces_between_special_tokens=True, no_stop_trim=False, stop_strings=[],
            stop_regexes=[pattern],
        )
    ])  # fmt: skip
    assert [d.text for d in detok.handle(batch).deltas] == [text]  # sent, not held back
    assert detok.states["r"].stop_regexes == []  # and never searched again
