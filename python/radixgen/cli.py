"""The `radixgen` command: `serve` (the HTTP server), `generate` (one offline answer) and
`batch` (a Batch API input file, offline).

Flags are built from the `ServerArgs` dataclass fields and named like SGLang's, so
`radixgen serve --model-path ... --port 30000` matches `python -m sglang.launch_server`; SGLang's
other launch flags are accepted without effect or refused with the reason (`sglang_flags`).
"""

from __future__ import annotations

import argparse
import json
import sys

from radixgen.config_file import expand_config_file
from radixgen.errors import InvalidRequestError
from radixgen.server_args import add_cli_args, from_cli_namespace
from radixgen.sglang_flags import DOC_PATH, foreign_flag_notes, log_flag_notes
from radixgen.version import __version__


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="Start the HTTP server (SGLang native API + OpenAI-compatible API).",
        description="Start the RadixGen HTTP server. /health answers 503 until the model is "
        "loaded, then 200; SIGINT / SIGTERM stop the server and every engine process.",
        epilog=f"SGLang's other launch flags are accepted too: {DOC_PATH} says which have no "
        "effect here (a startup-log warning each) and which are refused, and why.",
    )
    add_cli_args(p)


def _generate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "generate",
        help="Answer one prompt offline (no server) and print the text.",
        description="Start the engine in-process, answer one prompt, print it, and exit.",
    )
    p.add_argument("--prompt", required=True, help="The prompt (or user message with --chat).")
    p.add_argument("--chat", action="store_true", help="Wrap the prompt in the chat template.")
    p.add_argument(
        "--max-new-tokens", type=int, default=64, help="Tokens to generate (default 64)."
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0).")
    p.add_argument("--json", action="store_true", help="Print the whole SGLang-shaped result.")
    add_cli_args(p)


def _batch_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "batch",
        help="Run an OpenAI Batch API input file offline (no server), like vLLM's run-batch.",
        description="Run the lines of a Batch API input file (JSONL: custom_id, method, url, "
        "body; url /v1/chat/completions, /v1/completions or /v1/responses) on an in-process engine. Answers "
        "are appended as they finish: 2xx to the output file, the rest to the error file.",
    )
    p.add_argument("-i", "--input-file", required=True, help="Input JSONL, or - for stdin.")
    p.add_argument("-o", "--output-file", required=True, help="Output JSONL, or - for stdout.")
    p.add_argument(
        "--error-file",
        help="Error JSONL. Default: beside the output (out.errors.jsonl); with -o -, stdout.",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="Append to the output and error files, skipping the custom_ids they hold.",
    )
    add_cli_args(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixgen", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"radixgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,generate,batch}")
    _serve_parser(sub)
    _generate_parser(sub)
    _batch_parser(sub)
    return parser


def serve(ns: argparse.Namespace) -> int:
    from radixgen.runtime.entrypoints.http_server import run_server

    args = from_cli_namespace(ns)
    return run_server(args, foreign_flag_notes(ns))


def generate(ns: argparse.Namespace) -> int:
    from radixgen.runtime.entrypoints.engine import Engine

    args = from_cli_namespace(ns)
    log_flag_notes(foreign_flag_notes(ns))
    engine = Engine(**args.to_flat_dict())
    try:
        prompt = ns.prompt
        if ns.chat:
            prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        out = engine.generate(
            prompt, {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature}
        )
    finally:
        engine.shutdown()
    assert isinstance(out, dict)  # one prompt, not streamed: one result
    print(json.dumps(out, indent=2) if ns.json else out["text"])
    return 0


def batch(ns: argparse.Namespace) -> int:
    from radixgen.runtime.entrypoints.engine import Engine
    from radixgen.runtime.entrypoints.offline_batch import error_path_for, prepare_batch, run_batch

    if ns.resume and ns.output_file == "-":
        raise InvalidRequestError("--resume needs an output file, not -", "resume")
    error_file = ns.error_file or ("-" if ns.output_file == "-" else error_path_for(ns.output_file))
    args = from_cli_namespace(ns)
    log_flag_notes(foreign_flag_notes(ns))
    prepared = prepare_batch(ns.input_file, ns.output_file, error_file, ns.resume)
    engine = Engine(**args.to_flat_dict())
    try:
        ok, failed = run_batch(engine, prepared)
    finally:
        engine.shutdown()
    where = "" if error_file == "-" else f" (errors: {error_file})"
    print(f"radixgen batch: {ok} answered, {failed} failed{where}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in ("serve", "generate", "batch"):
            argv = [argv[0], *expand_config_file(argv[1:])]
    except InvalidRequestError as e:
        print(f"radixgen: error: {e}", file=sys.stderr)
        return 2
    ns = build_parser().parse_args(argv)
    try:
        if ns.command == "serve":
            return serve(ns)
        if ns.command == "batch":
            return batch(ns)
        return generate(ns)
    except InvalidRequestError as e:
        print(f"radixgen: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
