"""SGLang launch flags: each is implemented, accepted without effect (logged once), or refused
with its name and reason. Parse-level tests run in-process; one test launches a real server with
a realistic SGLang command line."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from radixgen.cli import build_parser, main
from radixgen.config_file import expand_config_file
from radixgen.errors import InvalidRequestError
from radixgen.server_args import ServerArgs, field_help, field_owners, from_cli_namespace
from radixgen.sglang_flag_table import IMPLEMENTED, TOPICS, FlagStatus
from radixgen.sglang_flags import (
    DOC_PATH,
    FOREIGN_FLAGS,
    ForeignFlag,
    foreign_flag_notes,
    markdown_table,
)

from .server_process import ServerProcess, server_flags

REPO = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def resolve(*argv: str) -> tuple[ServerArgs, list[str]]:
    ns = parse(*argv)
    args = from_cli_namespace(ns)
    return args, [n.message() for n in foreign_flag_notes(ns)]


def example_argv(flag: ForeignFlag, harmless: bool = False) -> list[str]:
    """The flag given a value that turns it on (or, with `harmless`, its harmless value)."""
    opt = f"--{flag.name}"
    if flag.arity == "switch":
        return [opt]
    if flag.arity == "negatable":
        return [f"--no-{flag.name}"] if harmless else [opt]
    if flag.arity == "values":
        return [opt, "a", "b"]
    if flag.arity == "optional":
        return [opt, "x"]
    return [opt, flag.harmless[0] if harmless else "7"]


def first_flag(topic_status: FlagStatus) -> list[ForeignFlag]:
    """The first flag of every topic with this status."""
    out = []
    for topic in TOPICS:
        if topic.status is topic_status:
            name = topic.specs.split()[0].partition("=")[0].split("|")[0].removesuffix("/no")
            out.append(next(f for f in FOREIGN_FLAGS if f.name == name))
    return out


# --- the table ---------------------------------------------------------------------------------


def test_every_sglang_server_flag_is_known_with_its_arity():
    """Against SGLang's own parser (its source ships in the sglang package): every option string
    parses here and takes as many values as there."""
    server_args = pytest.importorskip("sglang.srt.server_args")
    theirs = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(theirs)
    ours = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    missing, wrong_arity = [], []
    for action in theirs._actions:
        for opt in action.option_strings:
            if opt in ("-h", "--help"):
                continue
            mine = ours._option_string_actions.get(opt)
            if mine is None:
                missing.append(opt)
            elif _takes(action) != _takes(mine):
                wrong_arity.append((opt, _takes(action), _takes(mine)))
    assert not missing, f"SGLang flags argparse would reject here: {missing}"
    assert not wrong_arity, wrong_arity
    assert len(theirs._actions) > 500  # the whole ServerArgs, not a stub


def _takes(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "none"
    if action.nargs in ("+", "*"):
        return "list"
    return "optional" if action.nargs == "?" else "one"


def test_implemented_flags_are_fields():
    owners = field_owners()
    for name in IMPLEMENTED:
        assert name.replace("-", "_") in owners, name


def test_doc_table_is_generated_from_the_table():
    doc = (REPO / DOC_PATH).read_text()
    assert doc == markdown_table(field_help()), (
        f"regenerate: python -m radixgen.sglang_flags > {DOC_PATH}"
    )
    for flag in ("--trust-remote-code", "--lora-paths", "--tp-size", "--attention-backend"):
        assert f"`{flag}`" in doc


# --- a realistic command line, parsed ----------------------------------------------------------

REALISTIC = [
    "--model-path", "some/model", "--host", "127.0.0.1", "--port", "30001", "--tp-size", "1",
    "--mem-fraction-static", "0.1", "--context-length", "2048", "--trust-remote-code",
    "--chunked-prefill-size", "512", "--max-running-requests", "8", "--schedule-policy", "lpm",
    "--disable-cuda-graph", "--attention-backend", "torch_native", "--kv-cache-dtype", "auto",
    "--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3", "--enable-metrics",
    "--log-level", "warning", "--cuda-graph-max-bs", "16", "--dtype", "half",
    "--disable-overlap-schedule", "--enable-mixed-chunk", "--random-seed", "42",
]  # fmt: skip
REALISTIC_NO_EFFECT = (
    "--trust-remote-code",
    "--enable-mixed-chunk",
)  # fmt: skip


def test_realistic_sglang_command_line_parses_into_our_args_and_notes():
    args, notes = resolve(*REALISTIC)
    assert args.model.model_path == "some/model"
    assert args.model.context_length == 2048 and args.model.dtype == "float16"
    assert args.model.random_seed == 42 and args.http.port == 30001
    assert args.scheduler.max_running_requests == 8 and args.scheduler.schedule_policy == "lpm"
    assert args.scheduler.chunked_prefill_size == 512 and args.cache.mem_fraction_static == 0.1
    assert args.parsers.tool_call_parser == "qwen25" and args.parsers.reasoning_parser == "qwen3"
    assert args.http.enable_metrics and args.http.log_level == "warning"
    assert args.model.attention_backend == "torch"  # SGLang's torch_native
    assert args.scheduler.disable_overlap_schedule
    assert args.cuda_graph.disable_cuda_graph and args.cuda_graph.cuda_graph_max_bs == 16
    assert args.cache.kv_cache_dtype == "auto"  # implemented: no note
    assert len(notes) == len(REALISTIC_NO_EFFECT)
    for shown in REALISTIC_NO_EFFECT:
        assert sum(n.startswith(shown + " has no effect here") for n in notes) == 1, shown


# --- each group ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--model", "m"], "model_path", "m"),
        (["--tensor-parallel-size", "1"], "tp_size", 1),
        (["--data-parallel-size", "1"], "dp_size", 1),
        (["--dp-size", "2"], "dp_size", 2),
        (["--load-balance-method", "cache_aware"], "load_balance_method", "cache_aware"),
        (["--load-balance-method", "total_requests"], "load_balance_method", "shortest_queue"),
        (["--dtype", "float"], "dtype", "float32"),
        (["--grammar-backend", "llguidance"], "grammar_backend", "llguidance"),
        (["--max-prefill-tokens", "1024"], "max_prefill_tokens", 1024),
        (["--page-size", "4"], "page_size", 4),
        (["--enable-cache-report"], "enable_cache_report", True),
        (["--tool-call-parser", "mistral"], "tool_call_parser", "mistral"),
        (["--reasoning-parser", "deepseek-r1"], "reasoning_parser", "deepseek-r1"),
        (["--attention-backend", "triton"], "attention_backend", "triton"),
        (["--attention-backend", "torch_native"], "attention_backend", "torch"),
        (["--disable-overlap-schedule"], "disable_overlap_schedule", True),
        (["--disable-cuda-graph"], "disable_cuda_graph", True),
        (["--cuda-graph-max-bs", "64"], "cuda_graph_max_bs", 64),
        (["--cuda-graph-bs", "1", "2", "4"], "cuda_graph_bs", (1, 2, 4)),
        (["--kv-cache-dtype", "int8"], "kv_cache_dtype", "int8"),
        (["--kv-cache-dtype", "fp8_e4m3"], "kv_cache_dtype", "fp8_e4m3"),
        (["--kv-cache-dtype", "bfloat16"], "kv_cache_dtype", "bf16"),
        (["--enable-lora"], "enable_lora", True),
        (["--lora-paths", "a=/x", "/y"], "lora_paths", ("a=/x", "/y")),
        (["--lora-paths"], "lora_paths", ()),
        (["--max-loras-per-batch", "4"], "max_loras_per_batch", 4),
        (["--max-lora-rank", "32"], "max_lora_rank", 32),
        (
            ["--lora-target-modules", "q_proj", "v_proj"],
            "lora_target_modules",
            ("q_proj", "v_proj"),
        ),
    ],
)
def test_implemented_flags_set_our_fields(argv, field, value):
    args, notes = resolve(*argv)
    assert args.to_flat_dict()[field] == value
    assert notes == []


@pytest.mark.parametrize("flag", first_flag(FlagStatus.NO_EFFECT), ids=lambda f: f.name)
def test_no_effect_flags_are_accepted_and_noted_with_the_reason(flag):
    args, notes = resolve(*example_argv(flag), "--port", "4321")
    assert args.http.port == 4321  # the flag's values were consumed, the next flag still parses
    assert args == ServerArgs.from_kwargs(port=4321)  # and nothing else changed
    assert notes == [f"{' '.join(example_argv(flag))} has no effect here: {flag.reason}"]


@pytest.mark.parametrize("flag", first_flag(FlagStatus.REFUSED), ids=lambda f: f.name)
def test_refused_flags_stop_the_launch_naming_flag_and_reason(flag, capsys):
    argv = example_argv(flag)
    assert main(["serve", *argv, "--port", "4321"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("radixgen: error: ")
    assert f"{' '.join(argv)} is refused: {flag.reason}" in err
    assert "usage:" not in err  # not argparse's generic exit


@pytest.mark.parametrize(
    "argv",
    [["--pp-size", "1"], ["--attn-dp-size", "1"], ["--load-format", "auto"],
     ["--disaggregation-mode", "null"], ["--fastapi-root-path", ""]],
)  # fmt: skip
def test_refused_flags_given_what_runs_here_anyway_are_accepted(argv):
    args, notes = resolve(*argv)
    assert args == ServerArgs()
    assert len(notes) == 1 and notes[0].startswith(argv[0])
    assert "it asks for what runs anyway" in notes[0]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--schedule-policy", "lof"], "--schedule-policy lof is refused"),
        (["--tool-call-parser", "kimi_k2"], "--tool-call-parser kimi_k2 is refused"),
        (["--reasoning-parser", "gpt-oss"], "--reasoning-parser gpt-oss is refused"),
        (["--device", "npu"], "--device npu is refused"),
        (["--attention-backend", "fa3"], "--attention-backend fa3 is refused"),
        (
            ["--load-balance-method", "total_tokens"],
            "--load-balance-method total_tokens is refused",
        ),
        (["--tp-size", "0"], "tp_size must be >= 1"),
        (["--nnodes", "2"], "--nnodes > 1 needs --dist-init-addr host:port"),
        (["--pp-size", "2"], "--pp-size 2 is refused"),
        (["--kv-cache-dtype", "fp8_e5m2"], "--kv-cache-dtype fp8_e5m2 is refused"),
        (["--uno-lora-path", "/x"], "--uno-lora-path /x is refused"),
        (["--enable-lora", "--tp-size", "2"], "LoRA adapters are served with --tp-size 1"),
        (["--model-checksum", "--port", "5"], "--model-checksum is refused"),
    ],
)
def test_sglang_values_we_lack_are_refused_with_the_flag(argv, needle, capsys):
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "usage:" not in err


def test_lora_is_served_with_the_hicache_tiers():
    """Their blocks are keyed by the adapter's content (test_lora_engine.py serves both)."""
    args, _ = resolve("--enable-lora", "--enable-hierarchical-cache")
    assert args.lora.enabled and args.cache.enable_hierarchical_cache


def test_values_are_consumed_by_every_arity():
    args, notes = resolve(
        "--cuda-graph-bs-decode", "1", "2", "4", "--decode-attention-backend", "triton",
        "--enable-tf32-matmul", "--no-enable-fused-qk-norm-rope", "--context-length", "1024",
    )  # fmt: skip
    assert args.model.context_length == 1024
    assert sorted(n.split(" has no effect")[0] for n in notes) == [
        "--cuda-graph-bs-decode 1 2 4", "--decode-attention-backend triton", "--enable-tf32-matmul",
        "--no-enable-fused-qk-norm-rope",
    ]  # fmt: skip


def test_config_file_flags_go_first_and_the_command_line_wins(tmp_path):
    config = tmp_path / "flags.yaml"
    config.write_text(
        "model-path: from/file\ncontext_length: 1024\nenable-metrics: true\n"
        "disable-radix-cache: false\ntrust-remote-code: true\ncuda-graph-bs: [1, 2]\n"
    )
    argv = expand_config_file(["--config", str(config), "--context-length", "512"])
    args, notes = resolve(*argv)
    assert args.model.model_path == "from/file" and args.model.context_length == 512
    assert args.http.enable_metrics and not args.cache.disable_radix_cache
    assert args.cuda_graph.cuda_graph_bs == (1, 2)  # a list flag from the file
    assert [n.split(" has no effect")[0] for n in notes] == ["--trust-remote-code"]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "--config {path}: No such file"),
        ("- a list\n", "--config {path}: must hold a mapping of flags"),
        ("uno-lora-path: /x\n", "--uno-lora-path /x is refused: an adapter for the MoE"),
        ("enable-lora: true\ntp-size: 2\n", "LoRA adapters are served with --tp-size 1"),
        ("tp-size: 0\n", "tp_size must be >= 1"),
    ],
)
def test_config_file_errors_name_the_file_or_the_flag(tmp_path, capsys, content, needle):
    path = tmp_path / "flags.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle.format(path=path) in err and "usage:" not in err


def test_an_unread_config_flag_is_not_silently_dropped():
    with pytest.raises(InvalidRequestError, match="--config was not read"):
        from_cli_namespace(parse("--config", "x.yaml"))


def test_launch_server_refuses_before_loading_anything():
    r = subprocess.run(
        [sys.executable, "-m", "radixgen.launch_server", "--port", "1", "--uno-lora-path", "/y"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert "--uno-lora-path /y is refused: an adapter for the MoE experts" in r.stderr


# --- a realistic command line, served ----------------------------------------------------------


@pytest.mark.slow
def test_realistic_sglang_launch_command_serves():
    from radixgen.runtime.model_loader.resolve import default_model_file

    flags = list(REALISTIC)
    flags[flags.index("some/model")] = str(default_model_file())
    del flags[flags.index("--port") : flags.index("--port") + 2]  # ServerProcess picks a free one
    del flags[flags.index("--dtype") : flags.index("--dtype") + 2]  # float16 is slow on a CPU
    flags += ["--quantization", "gguf", "--served-model-name", "smol", "--watchdog-timeout", "300"]
    proc = ServerProcess(*flags, *server_flags())
    try:
        proc.wait_healthy()
        with httpx.Client(base_url=proc.url, timeout=120) as http:
            out = http.post(
                "/generate",
                json={"text": "Hello", "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
            )
            assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 3
            info = http.get("/get_server_info").json()
            assert info["max_context_length"] == 2048 and info["schedule_policy"] == "lpm"
            assert info["max_running_requests"] == 8 and info["tool_call_parser"] == "qwen25"
            assert http.get("/metrics").status_code == 200
        log = Path(proc.log_path).read_text()
        for shown in (*REALISTIC_NO_EFFECT, "--watchdog-timeout 300"):
            assert log.count(f"{shown} has no effect here") == 1, shown
    finally:
        proc.stop()
