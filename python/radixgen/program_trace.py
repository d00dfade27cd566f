"""The `program_trace` field of a /generate request: which DSL program run sent it, and where in
that program's tree of forks and calls it stands. Built by `radixgen.lang` (client), parsed and
checked by the API process (server); one definition of the wire format for both.

A node's place is a path. A program state's path is `""` for the program's own state, and each
segment below it names how the state came about: `fork<k>` the fork made by the k-th statement of
its state, then `<i>` branch i of that fork; `item<i>` the i-th program of a `run_batch`. So
`"fork2/1"` is branch 1 of a fork at statement 2 of the program, `"item0/fork3/0"` a branch inside
the first program of a batch. A call (one gen / select / prefix prefill, which may send several
requests) is `<state path>#<statement>` (`#<statement>.<j>` for the j-th call of one statement).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from radixgen.errors import InvalidRequestError

FIELD = "program_trace"
KINDS = ("gen", "select", "prefill")
MAX_ID_CHARS = 64
MAX_PATH_CHARS = 512
MAX_LABEL_CHARS = 200
MAX_DEPTH = 32
_ID_RE = re.compile(r"[A-Za-z0-9_-]+")
_SEGMENT_RE = re.compile(r"fork\d+|\d+|item\d+")
_CALL_RE = re.compile(r"#\d+(\.\d+)?")


@dataclass(frozen=True)
class ProgramTraceTag:
    """One request's place in a traced program run."""

    trace_id: str  # one per run() / run_batch() call
    node: str  # the call: `<parent>#<statement>`
    parent: str  # the program state the call runs in (a path, see the module docstring)
    kind: str  # gen | select | prefill
    label: str  # what the call is, for people: `gen("answer")`
    program: str | None = None  # the @function's name

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def state_segments(path: str) -> list[str]:
    """The segments of a state path (`""` -> none)."""
    return path.split("/") if path else []


def parse_program_trace(value: object) -> ProgramTraceTag | None:
    """The checked tag of a request body's `program_trace` (None when absent or null); errors
    name the sub-field, e.g. `program_trace.node`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError("program_trace must be an object", FIELD)
    fields = {"trace_id", "node", "parent", "kind", "label", "program"}
    for key in value:
        if key not in fields:
            raise InvalidRequestError(f"unknown field '{key}' in program_trace", f"{FIELD}.{key}")

    def text(key: str, limit: int, required: bool = True) -> str | None:
        v = value.get(key)
        if v is None and not required:
            return None
        if not isinstance(v, str) or (required and key != "parent" and not v):
            raise InvalidRequestError(f"program_trace.{key} must be a string", f"{FIELD}.{key}")
        if len(v) > limit:
            raise InvalidRequestError(
                f"program_trace.{key} is longer than {limit} characters", f"{FIELD}.{key}"
            )
        return v

    trace_id = text("trace_id", MAX_ID_CHARS)
    node, parent = text("node", MAX_PATH_CHARS), text("parent", MAX_PATH_CHARS)
    kind, label = text("kind", 16), text("label", MAX_LABEL_CHARS)
    program = text("program", MAX_LABEL_CHARS, required=False)
    assert trace_id is not None and node is not None and parent is not None
    assert kind is not None and label is not None
    if not _ID_RE.fullmatch(trace_id):
        raise InvalidRequestError(
            "program_trace.trace_id must be letters, digits, '_' or '-'", f"{FIELD}.trace_id"
        )
    segments = state_segments(parent)
    if len(segments) > MAX_DEPTH or not all(_SEGMENT_RE.fullmatch(s) for s in segments):
        raise InvalidRequestError(
            "program_trace.parent must be a state path like 'fork2/1' (see the README)",
            f"{FIELD}.parent",
        )
    if not node.startswith(parent + "#") or not _CALL_RE.fullmatch(node[len(parent) :]):
        raise InvalidRequestError(
            "program_trace.node must be '<parent>#<statement>'", f"{FIELD}.node"
        )
    if kind not in KINDS:
        raise InvalidRequestError(
            f"program_trace.kind must be one of {', '.join(KINDS)}", f"{FIELD}.kind"
        )
    return ProgramTraceTag(trace_id, node, parent, kind, label, program)
