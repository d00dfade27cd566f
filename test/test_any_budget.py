"""Explicit `Any` in the package, module by module, each with its reason (issue 30).

Precise types cross the package's boundaries: decoded JSON is `radixgen.json_types.JSONValue` /
`JSONObject`, SGLang's response dict `radixgen.generate_output.GenerateOutput`, values a function
checks itself are `object`. What remains is listed in `ANY_BUDGET`: how many `Any` names each
module uses (in annotations and expressions, read with `ast`: not in strings or comments, not
the `from typing import Any` line) and why. The table is exact: a module with an `Any` it does
not list, a count that grew, or a listed count above the real one (a stale entry: lower it,
or drop the module once it has none) all fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_layering import modules

from radixgen.package_layout import PACKAGE_ROOTS

SCHEMA = (
    "JSON-Schema documents walked node by node by the schema compiler: each keyword's value is "
    "read as the shape JSON Schema gives it, where `object` would need narrowing on every line "
    "(the entry points take a JSONValue)"
)
COMPILED = (
    "a grammar backend's compiled grammar: xgrammar, llguidance and outlines each have their "
    "own type, which the base class, the compile cache and the worker pool pass through"
)
CHECKED_VALUES = (
    "JSON values checked against jsonschema validators (jsonschema ships no type information)"
)
BACKEND_OPTIONS = "keyword options handed to the grammar library's own compiler call"
JINJA = (
    "chat messages and tools on their way into a Jinja chat template, which reads arbitrary "
    "keys (`**extra` forwards chat_template_kwargs)"
)
HF_CONFIG = (
    "a Hugging Face config.json (or a PEFT adapter_config.json) read key by key: keys and value "
    "types vary by model type, each value is converted where it is read"
)
GGUF = (
    "the gguf package's reader and its field values (numpy arrays, scalars, strings) mapped "
    "onto a Hugging Face config read key by key"
)
RESPONSES = (
    "OpenAI Responses API items (input items, output items, stored conversations, events) read "
    "and rewritten key by key; to become TypedDicts per item type"
)
BATCH = (
    "Batch API objects and JSONL lines (request bodies read for their prompt, file and batch "
    "objects read back from SQLite) handled key by key"
)
DASHBOARD = "the dashboard's JSON views, built incrementally and merged (counts added up per node)"
LANG_VALUES = (
    "SGLang's frontend API: program variables (a gen's text, a select's choice, a parser's "
    "result), the program's return value and meta_info are untyped there, and programs index "
    "them freely"
)
LANG_PAYLOAD = (
    "the /generate body a DSL backend builds and sends (JSON over HTTP, keyword arguments for "
    "Engine.generate) and the decoded answers and logprob entries it reads back"
)
LANG_MESSAGES = "chat messages a program builds for its chat template (role, content, ...)"
OPENAI_SDK = (
    "the openai SDK: create() keywords built as a dict (its overloads cannot take one) and the "
    "response objects read from it"
)
KWARGS = "**kwargs forwarded to an SGLang-compatible API (the Engine's flags, gen()'s keywords)"
LAZY = "PEP 562 lazy re-export: each name's type is declared where it is defined"
TORCH_DIST = "torch.distributed stores and the objects a rank broadcasts (pickled, any type)"
FLASHINFER = "flashinfer: an optional GPU library without type information"
CTYPES = "ctypes foreign functions of the CPU kernels' C library"
ZMQ = "pyzmq's send result (a future or an awaitable, depending on the socket)"
PSUTIL = "a psutil.Process (psutil ships no type information)"
SAMPLING = (
    "a user's sampling values stored unchecked until normalize() checks them (a float "
    "max_new_tokens is accepted there and made an int), which the fields' types cannot express"
)
FLAT_FLAGS = (
    "the flat flags dict feeds `Engine(**flat)`, whose named parameters each take one flag's "
    "type; a dict's value type cannot differ per key"
)
TOOL_SCHEMA = (
    "a tool's parameters (a JSON Schema) read keyword by keyword to build the forced-call grammar"
)

# module -> (number of `Any` names, why they remain)
ANY_BUDGET: dict[str, tuple[int, str]] = {
    "radixgen": (1, LAZY),
    "radixgen.sampling_params": (1, SAMPLING),
    "radixgen.server_args": (2, FLAT_FLAGS),
    "radixgen.kernels.attention.flashinfer_backend": (3, FLASHINFER),
    "radixgen.kernels.cpu.bindings": (1, CTYPES),
    "radixgen.lang": (1, LAZY),
    "radixgen.lang.adapter_scope": (2, LANG_PAYLOAD),
    "radixgen.lang.api": (2, KWARGS),
    "radixgen.lang.backend": (1, LAZY),
    "radixgen.lang.backend.base": (3, LANG_PAYLOAD),
    "radixgen.lang.backend.engine": (7, LANG_PAYLOAD + "; " + KWARGS),
    "radixgen.lang.backend.native": (12, LANG_PAYLOAD),
    "radixgen.lang.backend.openai": (13, OPENAI_SDK + "; " + LANG_PAYLOAD),
    "radixgen.lang.backend.runtime_endpoint": (6, LANG_PAYLOAD),
    "radixgen.lang.chat_template_base": (3, LANG_MESSAGES),
    "radixgen.lang.choices": (2, LANG_PAYLOAD),
    "radixgen.lang.executor": (8, LANG_VALUES + "; " + LANG_MESSAGES),
    "radixgen.lang.function": (2, KWARGS),
    "radixgen.lang.interpreter": (8, LANG_VALUES + "; " + LANG_MESSAGES),
    "radixgen.lang.ir": (5, LANG_PAYLOAD + "; a gen's dtype and fork states, as SGLang has them"),
    "radixgen.lang.local_runtime": (2, KWARGS + "; the transformers tokenizer it returns"),
    "radixgen.lang.run_trace": (2, LANG_PAYLOAD),
    "radixgen.lang.tracer": (3, LANG_VALUES + "; " + LANG_MESSAGES),
    "radixgen.runtime.batch.ordering": (2, BATCH),
    "radixgen.runtime.batch.runner": (2, BATCH),
    "radixgen.runtime.batch.store": (5, BATCH),
    "radixgen.runtime.constrained.base_grammar_backend": (6, COMPILED),
    "radixgen.runtime.constrained.compile_cache": (5, COMPILED),
    "radixgen.runtime.constrained.compile_pool": (5, COMPILED),
    "radixgen.runtime.constrained.compile_worker": (2, COMPILED),
    "radixgen.runtime.constrained.grammar_manager": (2, COMPILED),
    "radixgen.runtime.constrained.grammar_spec": (4, SCHEMA),
    "radixgen.runtime.constrained.llguidance_backend": (1, BACKEND_OPTIONS),
    "radixgen.runtime.constrained.schema_checks": (25, SCHEMA),
    "radixgen.runtime.constrained.schema_merge": (29, SCHEMA),
    "radixgen.runtime.constrained.schema_rewrite": (38, SCHEMA),
    "radixgen.runtime.constrained.schema_support": (27, SCHEMA),
    "radixgen.runtime.constrained.value_checker": (5, CHECKED_VALUES),
    "radixgen.runtime.constrained.xgrammar_backend": (1, BACKEND_OPTIONS),
    "radixgen.runtime.dashboard.traces": (10, DASHBOARD),
    "radixgen.runtime.distributed.parallel_state": (6, TORCH_DIST),
    "radixgen.runtime.request_side.dp_router": (1, ZMQ),
    "radixgen.runtime.request_side.scheduler_client": (1, ZMQ),
    "radixgen.runtime.entrypoints.openai.files_batches": (1, BATCH),
    "radixgen.runtime.entrypoints.openai.responses_events": (8, RESPONSES),
    "radixgen.runtime.entrypoints.openai.responses_items": (26, RESPONSES),
    "radixgen.runtime.entrypoints.openai.responses_store": (6, RESPONSES),
    "radixgen.runtime.entrypoints.openai.serving_chat": (4, JINJA),
    "radixgen.runtime.entrypoints.openai.serving_responses": (6, RESPONSES),
    "radixgen.runtime.entrypoints.openai.tool_call_grammar": (4, TOOL_SCHEMA),
    "radixgen.runtime.entrypoints.openai.tool_calls": (2, JINJA),
    "radixgen.runtime.entrypoints.server_state": (1, PSUTIL),
    "radixgen.runtime.lora.adapter": (2, HF_CONFIG),
    "radixgen.runtime.model_loader.gguf_archs": (8, GGUF),
    "radixgen.runtime.model_loader.gguf_convert": (15, GGUF),
    "radixgen.runtime.models.arch_features": (6, HF_CONFIG),
    "radixgen.runtime.models.encoder_config": (1, HF_CONFIG),
    "radixgen.runtime.models.model_config": (9, HF_CONFIG),
    "radixgen.runtime.models.sentence_config": (1, HF_CONFIG),
    "radixgen.runtime.text.tokenizer": (1, "tokenizer_config.json, read key by key"),
}

_TYPING_MODULES = ("typing", "typing_extensions", "t")


def count_any(source: str) -> int:
    """`Any` names used in a module's code: `Any` and `typing.Any`, in annotations (parsed as code
    under `from __future__ import annotations` too) and expressions; strings and comments, and
    the import itself, do not count."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        named = isinstance(node, ast.Name) and node.id == "Any"
        qualified = (
            isinstance(node, ast.Attribute)
            and node.attr == "Any"
            and isinstance(node.value, ast.Name)
            and node.value.id in _TYPING_MODULES
        )
        count += named or qualified
    return count


def package_any_counts() -> dict[str, int]:
    """Module -> its `Any` count, for every module of every package folder that has one."""
    counts: dict[str, int] = {}
    for package in PACKAGE_ROOTS:
        for name, path in modules(package):
            n = count_any(Path(path).read_text())
            if n:
                counts[name] = n
    return counts


def budget_problems(counts: dict[str, int], budget: dict[str, tuple[int, str]]) -> list[str]:
    problems = []
    for module, n in sorted(counts.items()):
        if module not in budget:
            problems.append(f"{module}: {n} Any not listed in ANY_BUDGET (type it, or list why)")
        elif n > budget[module][0]:
            problems.append(f"{module}: {n} Any, more than the {budget[module][0]} listed")
    for module, (listed, reason) in sorted(budget.items()):
        if not reason.strip():
            problems.append(f"{module}: listed without a reason")
        if listed <= 0:
            problems.append(f"{module}: listed with {listed} Any (drop the entry)")
        elif counts.get(module, 0) < listed:
            problems.append(
                f"{module}: {counts.get(module, 0)} Any, fewer than the {listed} listed "
                "(lower the entry, or drop it at 0)"
            )
    return problems


def test_every_any_is_listed_with_its_reason() -> None:
    problems = budget_problems(package_any_counts(), ANY_BUDGET)
    assert not problems, "\n".join(problems)


def test_the_scan_sees_the_package() -> None:
    counts = package_any_counts()
    names = {n for p in PACKAGE_ROOTS for n, _ in modules(p)}
    assert "radixgen.runtime.entrypoints.engine" in names and "radixgen.lang.api" in names
    assert "radixgen.runtime.constrained.schema_rewrite" in counts  # the scan reads real code
    assert "radixgen.runtime.entrypoints.engine" not in counts  # the public Engine API: no Any


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from typing import Any\n", 0),
        ("from typing import Any\nx: Any = 1\n", 1),
        ("import typing\ndef f(a: typing.Any) -> dict[str, typing.Any]: ...\n", 2),
        ("from __future__ import annotations\ndef f(*a: Any, **k: Any) -> list[Any]: ...\n", 3),
        ("x = 'Any'  # Any in a string and a comment\n", 0),
        ("from typing import cast\ny = cast(Any, 1)\n", 1),
    ],
)
def test_count_any_reads_code_not_text(source: str, expected: int) -> None:
    assert count_any(source) == expected


def test_the_check_fails_on_a_new_any_a_grown_count_and_a_stale_entry() -> None:
    budget = {"pkg.a": (2, "why"), "pkg.b": (1, "why")}
    assert budget_problems({"pkg.a": 2, "pkg.b": 1}, budget) == []
    assert budget_problems({"pkg.a": 2, "pkg.b": 1, "pkg.c": 1}, budget) == [
        "pkg.c: 1 Any not listed in ANY_BUDGET (type it, or list why)"
    ]
    assert budget_problems({"pkg.a": 3, "pkg.b": 1}, budget) == [
        "pkg.a: 3 Any, more than the 2 listed"
    ]
    assert budget_problems({"pkg.a": 1}, budget) == [
        "pkg.a: 1 Any, fewer than the 2 listed (lower the entry, or drop it at 0)",
        "pkg.b: 0 Any, fewer than the 1 listed (lower the entry, or drop it at 0)",
    ]
    assert budget_problems({"pkg.a": 1}, {"pkg.a": (1, " ")}) == ["pkg.a: listed without a reason"]
    assert budget_problems({}, {"pkg.a": (0, "why")}) == [
        "pkg.a: listed with 0 Any (drop the entry)"
    ]
