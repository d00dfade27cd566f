"""Failures surface with the program's own line, never as a hung thread. As in SGLang, run()
returns a state whose error() holds a failed statement's error (text so far kept), while an
exception raised by the program's own code propagates from run()."""

from __future__ import annotations

import re
import threading
import time
import traceback

import pytest
from wait_helpers import wait_until

import radixgen as rg


def test_exception_in_program_code_propagates_with_its_line(endpoint):
    @rg.function
    def broken(s):
        s += "Hello" + rg.gen("x", max_tokens=2, temperature=0)
        raise LookupError("no such tool")  # the line the traceback must show

    with pytest.raises(LookupError, match="no such tool") as info:
        broken.run(backend=endpoint)
    frames = traceback.extract_tb(info.tb)
    assert any(f.name == "broken" and "LookupError" in (f.line or "") for f in frames)


def test_invalid_regex_is_rejected_at_the_gen_call():
    with pytest.raises(ValueError, match=r"invalid regex '\(\[': "):
        rg.gen("x", regex="([")


def test_server_rejected_regex_names_the_program_line(endpoint):
    @rg.function
    def lookahead(s):
        s += "Answer: "
        s += rg.gen("x", max_tokens=4, regex=r"(?=a)ab")  # valid in Python, not for the grammar
        s += rg.gen("y", max_tokens=2)

    state = lookahead.run(backend=endpoint)
    error = state.error()
    assert isinstance(error, rg.ProgramError)
    message = str(error)
    assert "test_errors.py" in message and 'regex=r"(?=a)ab"' in message
    assert "invalid regex" in message and "gen('x') failed" in message
    assert isinstance(error.__cause__, rg.BackendError)
    assert error.__cause__.status == 400
    # the text before the failure is kept; the statements after it did not run
    assert state.text() == "Answer: " and "y" not in state
    with pytest.raises(rg.ProgramError, match="invalid regex"):
        state["x"]


def test_run_keeps_the_error_like_sglangs_run(lang_server, endpoint):
    """The same failing program on SGLang's frontend and ours: neither run() raises, both states
    hold the server's refusal in error() and keep the text so far."""
    sglang = pytest.importorskip("sglang")

    def make(sgl):
        @sgl.function
        def bad(s):
            s += "Answer: "
            s += sgl.gen("x", max_tokens=4, regex=r"(?=a)ab")
            s += "after"

        return bad

    theirs = make(sglang).run(
        backend=sglang.RuntimeEndpoint(lang_server.url, chat_template_name="chatml")
    )
    ours = make(rg).run(backend=endpoint)
    assert theirs.error() is not None and "invalid regex" in str(theirs.error())
    assert isinstance(ours.error(), rg.ProgramError) and "invalid regex" in str(ours.error())
    assert ours.text() == theirs.text() == "Answer: "


def test_a_failed_fork_branch_becomes_the_parents_error(endpoint):
    @rg.function
    def branches(s):
        s += "Pick:"
        forks = s.fork(2)
        forks[0] += rg.gen("ok", max_tokens=2, temperature=0)
        forks[1] += rg.gen("bad", max_tokens=2, regex=r"(?=a)ab")
        forks.join()  # does not raise, as SGLang's join
        s += " done"

    state = branches.run(backend=endpoint)
    assert isinstance(state.error(), rg.ProgramError) and "gen('bad') failed" in str(state.error())
    assert state.text() == "Pick:"  # statements after the failure were dropped


def test_reading_a_failed_variable_raises_instead_of_hanging(engine_backend):
    @rg.function
    def reads_failed(s):
        s += "Answer: " + rg.gen("x", max_tokens=4, regex=r"(?=a)ab")
        return s["x"]

    started = time.monotonic()
    with pytest.raises(rg.ProgramError, match="invalid regex"):
        reads_failed.run(backend=engine_backend)
    assert time.monotonic() - started < 30


def test_batch_keeps_each_programs_error(endpoint):
    @rg.function
    def maybe_fails(s, fail):
        s += "Hi" + rg.gen("x", max_tokens=2, temperature=0)
        if fail:
            raise ValueError("item failed")

    states = maybe_fails.run_batch([{"fail": False}, {"fail": True}], backend=endpoint)
    assert states[0].error() is None and states[0]["x"] is not None
    assert isinstance(states[1].error(), ValueError)


def test_streaming_error_ends_the_iterator(endpoint):
    @rg.function
    def stream_fails(s):
        s += "Go:" + rg.gen("x", max_tokens=4, regex=r"(?=a)ab")

    state = stream_fails.run(stream=True, backend=endpoint)
    assert "".join(state.text_iter()) == "Go:"  # ends quietly, as SGLang's text_iter
    assert isinstance(state.error(), rg.ProgramError)
    assert "invalid regex" in str(state.error()) and "gen('x') failed" in str(state.error())


def test_bad_arguments_fail_at_definition_or_call(endpoint):
    with pytest.raises(TypeError, match="must be named 's'"):
        rg.function(lambda state: None)
    with pytest.raises(ValueError, match="dtype must be"):
        rg.gen("x", dtype=list)
    with pytest.raises(ValueError, match="json_schema is not valid JSON"):
        rg.gen("x", json_schema="{not json")
    with pytest.raises(ValueError, match="no backend"):
        rg.function(lambda s: None).run()

    @rg.function
    def unset(s):
        return s["never"]

    with pytest.raises(KeyError, match="never"):
        unset.run(backend=endpoint)


def test_no_program_threads_are_left_behind(endpoint):
    @rg.function
    def small(s):
        s += "Hi" + rg.gen("x", max_tokens=1)
        forks = s.fork(2)
        forks += rg.gen("y", max_tokens=1)
        forks.join()

    before = {t for t in threading.enumerate() if t.name == "radixgen-program"}
    for _ in range(3):
        small.run(backend=endpoint)

    def program_threads_exited() -> bool:
        after = {t for t in threading.enumerate() if t.name == "radixgen-program"}
        return not (after - before)

    wait_until(program_threads_exited, 0.5, what="worker threads of finished programs to exit")


def test_an_invalid_stop_regex_is_refused_by_the_server_naming_the_pattern(backend):
    """stop_regex is served (test_primitives.py); a pattern that does not compile is the
    server's 400, raised with the program's line instead of a generation that ignores it."""

    @rg.function
    def prog(s):
        s += "Count: 1, 2," + rg.gen("rest", max_tokens=8, stop_regex=r"(\d")

    error = prog.run(backend=backend).error()
    assert isinstance(error, rg.ProgramError)
    assert re.search(r"stop_regex pattern 0 .* is not a valid regular", str(error)), error
