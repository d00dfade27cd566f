"""Regression (issue 12): an abort sent 0-0.3 s after its request, racing the request's admission,
must still answer the request promptly with finish_reason abort.

The soak found aborted requests that never got an answer: an abort naming an n > 1 request during
its shared-prompt prefill went nowhere (the samples' rids were registered after the prefill), and
an abort that reaches the API before the request's state exists was dropped. Plain, n > 1 and
constrained requests (aborted while waiting for their grammar to compile) are raced here, beside
a request streaming the whole time.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import needs_grammar

LONG = {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0.8}
ANSWER_WITHIN_S = 30.0  # generous: the requests would run ~25 s each, the soak waited 120 s
DELAYS = [0.0, 0.05, 0.1, 0.2, 0.3]


def _body(kind: str, i: int) -> dict:
    if kind == "n3":
        return {"text": "List some fruits:", "sampling_params": {**LONG, "n": 3}}
    if kind == "regex":  # a new pattern each time: the request waits for its own compile
        return {"text": "Digits:", "sampling_params": {**LONG, "regex": f"[0-9]{{{i},400}}"}}
    return {"text": "Tell me a story:", "sampling_params": LONG}


def _finish_reasons(body: dict | list) -> list[dict]:
    items = body if isinstance(body, list) else [body]
    return [item["meta_info"]["finish_reason"] for item in items]


@needs_grammar
def test_aborts_racing_admission_always_get_an_answer(base_url):
    stop = threading.Event()

    def background_stream() -> None:  # other load, the whole time
        with httpx.Client(base_url=base_url, timeout=120) as c:
            while not stop.is_set():
                with c.stream("POST", "/generate", json={
                    "text": "Count:", "stream": True,
                    "sampling_params": {"max_new_tokens": 16}}) as r:  # fmt: skip
                    for _ in r.iter_lines():
                        pass

    load = threading.Thread(target=background_stream)
    load.start()
    failures = []
    try:
        with httpx.Client(base_url=base_url, timeout=120) as http, ThreadPoolExecutor(2) as pool:
            for i, (kind, delay) in enumerate(
                (k, d) for k in ("n3", "regex", "plain") for d in DELAYS
            ):
                rid = f"race-{kind}-{i}"
                started = time.monotonic()
                fut = pool.submit(http.post, "/generate", json={**_body(kind, i), "rid": rid})
                time.sleep(delay)
                assert http.post("/abort_request", json={"rid": rid}).status_code == 200
                try:
                    r = fut.result(timeout=ANSWER_WITHIN_S)
                except TimeoutError:
                    failures.append(f"{rid} (abort after {delay} s): no answer")
                    http.post("/abort_request", json={"abort_all": True})
                    fut.result(timeout=60)
                    continue
                took = time.monotonic() - started
                reasons = _finish_reasons(r.json()) if r.status_code == 200 else r.text
                if r.status_code != 200 or any(fr["type"] != "abort" for fr in reasons):
                    failures.append(f"{rid}: {r.status_code} {reasons} after {took:.1f} s")
    finally:
        stop.set()
        load.join(60)
    assert not failures, failures


@pytest.fixture(autouse=True)
def _idle_after(http):
    yield
    http.post("/abort_request", json={"abort_all": True})
