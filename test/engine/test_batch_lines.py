"""`radixgen batch`'s input reading (`read_lines`): each bad line gets its own error record and
every other line still runs. Model-free: no engine is started."""

from __future__ import annotations

import io
import json

from radixgen.runtime.entrypoints.offline_batch import read_lines

ENDPOINTS = {"/v1/chat/completions", "/v1/completions"}


def chat(custom_id: str, url: object = "/v1/chat/completions") -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    line = {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
    return json.dumps(line).encode() + b"\n"


def test_a_url_that_is_no_string_is_that_line_s_error_only():
    source = io.BytesIO(
        chat("first")
        + chat("listed", ["/v1/chat/completions"])
        + chat("object", {"path": "/v1/completions"})
        + chat("number", 7)
        + chat("other", "/v1/embeddings")
        + chat("last", "/v1/completions")
    )
    good, bad = read_lines(source, ENDPOINTS)
    assert [(g.line_no, g.custom_id, g.url) for g in good] == [
        (1, "first", "/v1/chat/completions"),
        (6, "last", "/v1/completions"),
    ]
    errors = {b["custom_id"]: b["error"] for b in bad}
    assert list(errors) == ["listed", "object", "number", "other"]
    for custom_id, line_no, kind in (("listed", 2, "an array"), ("object", 3, "an object"),
                                     ("number", 4, "a number")):  # fmt: skip
        error = errors[custom_id]
        assert isinstance(error, dict) and error["code"] == "invalid_request"
        assert error["message"] == f"line {line_no}: url must be a string, got {kind}"
    other = errors["other"]
    assert isinstance(other, dict) and "'/v1/embeddings'" in str(other["message"])
