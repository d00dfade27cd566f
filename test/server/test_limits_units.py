"""The request limits as plain functions (no server): boundaries, messages, flags, statuses."""

from __future__ import annotations

import argparse

import orjson
import pytest

from radixgen.errors import InvalidRequestError, QueueFullError, RequestTooLargeError
from radixgen.runtime.entrypoints.http_utils import error_response
from radixgen.runtime.request_side.request_limits import RequestLimits
from radixgen.server_args import LimitsConfig, ServerArgs, add_cli_args, from_cli_namespace

LIMITS = RequestLimits(
    LimitsConfig(
        max_prompt_chars=10, max_sequences_per_request=4, max_stop_strings=2,
        max_stop_string_chars=3,
    )
)  # fmt: skip


def test_limits_are_inclusive_and_refusals_name_size_limit_and_flag():
    LIMITS.check_prompt_chars(10, "text")
    with pytest.raises(
        InvalidRequestError, match=r"^the prompt has 11 characters; the limit is 10"
    ):
        LIMITS.check_prompt_chars(11, "text")
    LIMITS.check_sequences(4)
    LIMITS.check_stop_strings(["abc", "d"])
    with pytest.raises(InvalidRequestError) as e:
        LIMITS.check_prompt_chars(11, "messages")
    assert (str(e.value), e.value.param) == (
        "the messages have 11 characters; the limit is 10 (--max-prompt-chars)",
        "messages",
    )
    with pytest.raises(InvalidRequestError, match=r"starts 5 sequences .* limit is 4 \(--max-seq"):
        LIMITS.check_sequences(5)
    with pytest.raises(InvalidRequestError, match=r"stop has 3 strings; the limit is 2 \(--max-"):
        LIMITS.check_stop_strings(["a", "b", "c"])
    with pytest.raises(
        InvalidRequestError, match=r"stop string 1 has 4 characters; the limit is 3"
    ):
        LIMITS.check_stop_strings(["a", "abcd"])


def test_no_sequence_limit_when_unset():
    RequestLimits(LimitsConfig(max_sequences_per_request=None)).check_sequences(10**6)


@pytest.mark.parametrize(
    "flag, value",
    [("max_request_body_bytes", 0), ("request_body_timeout", 0.0), ("max_prompt_chars", 0),
     ("max_sequences_per_request", 0), ("max_stop_strings", -1), ("max_stop_string_chars", 0),
     ("max_queued_requests", -1)],
)  # fmt: skip
def test_bad_limit_values_are_refused_at_start(flag, value):
    with pytest.raises(InvalidRequestError, match=flag):
        ServerArgs.from_kwargs(**{flag: value})


def test_limits_are_flags_with_finite_defaults():
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    args = from_cli_namespace(parser.parse_args(["--max-stop-strings", "4"]))
    assert args.limits.max_stop_strings == 4
    assert args.limits.max_request_body_bytes == 8 * 1024 * 1024
    assert args.limits.max_sequences_per_request == 256
    assert (args.limits.max_stop_strings, args.limits.max_stop_string_chars) == (4, 128)
    assert args.scheduler.max_queued_requests == 256  # finite: a full queue answers 429


def test_statuses_and_headers_of_limit_errors():
    busy = error_response(QueueFullError("the server is busy", retry_after_s=3))
    assert busy.status_code == 429 and busy.headers["retry-after"] == "3"
    assert orjson.loads(busy.body)["error"]["type"] == "server_overloaded"
    big = error_response(RequestTooLargeError("too large", None))
    assert big.status_code == 413 and "retry-after" not in big.headers
    assert orjson.loads(big.body)["error"] == {
        "message": "too large", "type": "request_too_large", "param": None, "code": 413
    }  # fmt: skip
