"""SGLang launch flags on our command line: added to the parser from `sglang_flag_table`, then
either accepted without effect (one startup-log line each) or refused with the flag and the reason.

A flag that takes values consumes them even when it changes nothing, so the rest of an SGLang
launch command still parses. Imported by `server_args` (its command-line parser) and the CLI; it
imports neither, so `markdown_table` is handed `server_args.field_help()`.
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from radixgen.errors import InvalidRequestError
from radixgen.sglang_flag_table import (
    ALIASES,
    IMPLEMENTED,
    IMPLEMENTED_ON_THE_COMMAND_LINE,
    TOPICS,
    VALUE_COMPAT,
    FlagStatus,
    FlagTopic,
)

Arity = Literal["switch", "negatable", "value", "values", "optional"]
DEST_PREFIX = "sglang_flag__"
DOC_PATH = "python/radixgen/sglang_flags.md"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForeignFlag:
    """One SGLang flag without a field here."""

    names: tuple[str, ...]  # the first is SGLang's main spelling, without the dashes
    arity: Arity
    status: FlagStatus
    reason: str
    harmless: tuple[str, ...] = ()  # values that ask for what runs here anyway

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def dest(self) -> str:
        return DEST_PREFIX + self.name.replace("-", "_")

    def status_for(self, value: object) -> FlagStatus:
        """NO_EFFECT or REFUSED for this value (a refused flag given a harmless value is fine)."""
        if self.status is FlagStatus.NO_EFFECT or _is_harmless(self, value):
            return FlagStatus.NO_EFFECT
        return FlagStatus.REFUSED


@dataclass(frozen=True)
class FlagNote:
    """An SGLang flag given on the command line that is accepted without effect."""

    flag: ForeignFlag
    value: object

    def message(self) -> str:
        shown = _shown(self.flag, self.value)
        if self.flag.status is FlagStatus.REFUSED:  # given the value that runs here anyway
            return f"{shown} has no effect here: it asks for what runs anyway ({self.flag.reason})"
        return f"{shown} has no effect here: {self.flag.reason}"


def _parse_spec(word: str, topic: FlagTopic) -> ForeignFlag:
    head, eq, tail = word.partition("=")
    arity: Arity = "switch"
    harmless: tuple[str, ...] = ()
    if head.endswith("/no"):
        head, arity = head[: -len("/no")], "negatable"
    elif eq:
        arity = "values" if tail == "*" else "optional" if tail == "?" else "value"
        if arity == "value" and tail:
            harmless = tuple("" if v == '""' else v for v in tail.split(","))
    return ForeignFlag(tuple(head.split("|")), arity, topic.status, topic.reason, harmless)


def _build() -> tuple[ForeignFlag, ...]:
    flags = [_parse_spec(word, topic) for topic in TOPICS for word in topic.specs.split()]
    names = [n for f in flags for n in f.names]
    implemented = {*IMPLEMENTED, *IMPLEMENTED_ON_THE_COMMAND_LINE}
    dupes = {n for n in names if names.count(n) > 1} | (set(names) & implemented)
    assert not dupes, f"SGLang flags listed twice: {sorted(dupes)}"
    return tuple(flags)


FOREIGN_FLAGS: tuple[ForeignFlag, ...] = _build()


def _is_harmless(flag: ForeignFlag, value: object) -> bool:
    if flag.arity in ("switch", "negatable"):
        return value is False  # --no-<flag>: asks for it off, as it is here
    if flag.arity == "values":
        return not value
    if value is None:
        return False  # an optional value left out: the feature with its default setting
    return any(_same_value(str(value), h) for h in flag.harmless)


def _same_value(given: str, harmless: str) -> bool:
    if given.strip() == harmless:
        return True
    try:
        return float(given) == float(harmless)
    except ValueError:
        return False


def _shown(flag: ForeignFlag, value: object) -> str:
    if flag.arity in ("switch", "negatable"):
        return f"--{flag.name}" if value else f"--no-{flag.name}"
    if isinstance(value, list):
        return " ".join([f"--{flag.name}", *map(str, value)])
    return f"--{flag.name}" if value is None else f"--{flag.name} {value}"


# --- the parser ----------------------------------------------------------------------------------


def add_foreign_flags(parser: argparse.ArgumentParser) -> None:
    """Every SGLang flag without a field here, out of --help (python/radixgen/sglang_flags.md lists them)."""
    group = parser.add_argument_group("SGLang flags without a counterpart here")
    for flag in FOREIGN_FLAGS:
        opts = [f"--{n}" for n in flag.names]
        add = functools.partial(
            group.add_argument, dest=flag.dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        if flag.arity == "switch":
            add(*opts, action="store_true")
        elif flag.arity == "negatable":
            add(*opts, action=argparse.BooleanOptionalAction)
        elif flag.arity == "values":
            add(*opts, nargs="*")
        elif flag.arity == "optional":
            add(*opts, nargs="?", const=None)
        else:
            add(*opts)


def flag_aliases(name: str) -> tuple[str, ...]:
    """SGLang's other spellings of one of our flags (`--model` for `--model-path`)."""
    return ALIASES.get(name, ())


def cli_choices(name: str, ours: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Our choices plus SGLang's other values of the flag, so those reach `check_values` and get
    a reason instead of argparse's bare 'invalid choice'."""
    compat = VALUE_COMPAT.get(name)
    if ours is None or compat is None:
        return ours
    extra = [v for v in compat.values if v not in ours]
    return (*ours, *extra)


def value_alias(name: str, value: str) -> str:
    """Our spelling of an SGLang value (`--dtype half` is float16)."""
    compat = VALUE_COMPAT.get(name)
    return dict(compat.aliases).get(value, value) if compat else value


def check_values(values: Mapping[str, object], choices: Mapping[str, tuple[str, ...]]) -> None:
    """Refuse an SGLang value of one of our flags that is not implemented here."""
    for field_name, value in values.items():
        name = field_name.replace("_", "-")
        compat, ours = VALUE_COMPAT.get(name), choices.get(field_name)
        if compat is None or ours is None or value is None or value in ours:
            continue
        if value in compat.values:
            raise InvalidRequestError(
                f"--{name} {value} is refused: {compat.refusal} (available: {', '.join(ours)})",
                field_name,
            )


def foreign_flag_notes(ns: argparse.Namespace) -> list[FlagNote]:
    """The SGLang flags given without a field here: notes for those accepted without effect;
    the first refused one raises, naming itself and why."""
    notes = []
    for flag in FOREIGN_FLAGS:
        if not hasattr(ns, flag.dest):
            continue
        value = getattr(ns, flag.dest)
        if flag.status_for(value) is FlagStatus.REFUSED:
            raise InvalidRequestError(
                f"{_shown(flag, value)} is refused: {flag.reason}", flag.name.replace("-", "_")
            )
        notes.append(FlagNote(flag, value))
    return notes


def log_flag_notes(notes: Iterable[FlagNote]) -> None:
    """One warning per flag given without effect (the launching process logs them, once)."""
    for note in notes:
        logger.warning("%s", note.message())


# --- the documentation table ---------------------------------------------------------------------


def markdown_table(helps: Mapping[str, str]) -> str:
    """python/radixgen/sglang_flags.md: every SGLang flag, what it does here and why (a test keeps the file
    equal to this). helps: `server_args.field_help()`, passed in because server_args imports
    this module."""
    rows: list[tuple[str, str, str]] = []
    for name in IMPLEMENTED:
        spelled = " / ".join(f"`--{n}`" for n in (name, *flag_aliases(name)))
        extra = VALUE_COMPAT.get(name)
        note = helps[name.replace("-", "_")]
        if extra and extra.aliases:
            note += " SGLang's " + ", ".join(f"`{a}` = `{b}`" for a, b in extra.aliases) + "."
        if extra and extra.refusal:
            note += f" SGLang's other values are refused: {extra.refusal}."
        rows.append((spelled, FlagStatus.IMPLEMENTED.value, note))
    for name, note in IMPLEMENTED_ON_THE_COMMAND_LINE.items():
        rows.append((f"`--{name}`", FlagStatus.IMPLEMENTED.value, note))
    for flag in FOREIGN_FLAGS:
        spelled = " / ".join(f"`--{n}`" for n in flag.names)
        status = flag.status.value
        if flag.status is FlagStatus.REFUSED and flag.harmless:
            shown = ", ".join(f"`{h}`" if h else '`""`' for h in flag.harmless)
            status += f" (accepted, no effect: {shown})"
        rows.append((spelled, status, flag.reason))
    counts = {s: sum(1 for r in rows if r[1].startswith(s.value)) for s in FlagStatus}
    lines = [
        "# SGLang launch flags in RadixGen",
        "",
        "Generated by `python -m radixgen.sglang_flags` from `python/radixgen/sglang_flag_table.py`"
        " (a test keeps this file in step). `radixgen serve` and `python -m "
        "radixgen.launch_server` accept every flag of SGLang 0.5.23's `ServerArgs`: implemented, "
        "accepted with no effect (one startup-log warning each, with the reason), or refused "
        "(the launch stops with an error naming the flag and why).",
        "",
        ", ".join(f"{s.value}: {n}" for s, n in counts.items()) + ".",
        "",
        "| flag | here | what it does here / why |",
        "|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c.replace('|', '/')} |" for a, b, c in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from radixgen.server_args import field_help

    print(markdown_table(field_help()), end="")
