"""Program traces on the client, without a server: the places a traced run gives its calls are
ones the server's parser accepts, the tag reaches only the requests sent inside a traced call, and
a program with its own `trace` parameter keeps it (the server side: test/server/test_program_traces.py)."""

from __future__ import annotations

from typing import Any

import radixgen as rg
from radixgen.lang.run_trace import TraceScope, tagged, with_trace
from radixgen.program_trace import FIELD, parse_program_trace


def test_scopes_make_paths_the_server_accepts() -> None:
    root = TraceScope.new("prog")
    branch = root.branch(2, 1)
    nested = root.item(3).branch(0, 0).branch(4, 2)
    assert (root.path, branch.path, nested.path) == ("", "fork2/1", "item3/fork0/0/fork4/2")
    assert branch.trace_id == nested.trace_id == root.trace_id
    for scope in (root, branch, nested):
        for call in (0, 1):
            tag = scope.tag(5, call, "gen", "gen('x')")
            assert parse_program_trace(tag.to_dict()) == tag
    assert branch.tag(5, 1, "select", "s").node == "fork2/1#5.1"


def test_only_requests_inside_a_traced_call_carry_the_tag() -> None:
    payload = {"text": "hi"}
    assert with_trace(payload) is payload
    tag = TraceScope.new("prog").tag(0, 0, "gen", "gen('a')")
    with tagged(tag):
        sent = with_trace(payload)
        with tagged(None):  # an untraced state inside keeps the outer call's tag
            assert with_trace(payload)[FIELD] == tag.to_dict()
    assert sent == {"text": "hi", FIELD: tag.to_dict()} and FIELD not in payload
    assert with_trace(payload) is payload


def test_a_program_parameter_named_trace_still_gets_its_value() -> None:
    @rg.function
    def has_trace(s: Any, trace: int = 0) -> None:
        s += str(trace)

    @rg.function
    def plain(s: Any) -> None:
        s += "x"

    kwargs: dict[str, Any] = {}
    assert has_trace._take_trace(True, kwargs) is False and kwargs == {"trace": True}
    kwargs = {}
    assert has_trace._take_trace(None, kwargs) is False and kwargs == {}
    assert plain._take_trace(True, kwargs) is True and kwargs == {}
    assert plain._take_trace(None, kwargs) is False
