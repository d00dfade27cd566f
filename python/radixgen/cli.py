"""The `radixgen` command: `serve` (the HTTP server), `generate` (one offline answer), `batch`
(a Batch API input file, offline) and `router` (one endpoint in front of several servers).

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


def _router_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "router",
        help="One endpoint in front of several servers, routing each request by its model.",
        description="Forward each request to a worker serving the model it names: a generation "
        "model and an embedding or rerank model (--is-embedding servers) behind one endpoint. "
        "Among the workers of one model the policy chooses (cache-aware by default, as SGLang's "
        "router). Workers are read from their /v1/models and /model_info at start and every "
        "--health-check-interval-secs; /workers lists them, /v1/models lists their models.",
    )
    p.add_argument(
        "--worker-urls", nargs="+", required=True, help="The servers' URLs (http://host:port)."
    )
    p.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
    p.add_argument("--port", type=int, default=30000, help="Port to bind (default 30000).")
    p.add_argument(
        "--policy",
        default="cache_aware",
        choices=("cache_aware", "round_robin", "shortest_queue"),
        help="How one model's workers share its requests (default cache_aware).",
    )
    p.add_argument(
        "--api-key",
        help="Require 'Authorization: Bearer <key>' on every route but /health; the router "
        "also sends it to the workers (forwarded requests carry the client's own header).",
    )
    p.add_argument(
        "--health-check-interval-secs",
        type=float,
        default=10.0,
        help="How often the workers are read again (default 10 s).",
    )
    p.add_argument(
        "--request-timeout-secs",
        type=float,
        default=1800.0,
        help="A forwarded request's limit; over it the client gets a 504 (default 1800 s).",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="Log level.",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixgen", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"radixgen {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{serve,generate,batch,router}"
    )
    _serve_parser(sub)
    _generate_parser(sub)
    _batch_parser(sub)
    _router_parser(sub)
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


def router(ns: argparse.Namespace) -> int:
    from radixgen.runtime.router.router_app import RouterConfig, run_router

    config = RouterConfig(
        worker_urls=tuple(ns.worker_urls),
        policy=ns.policy,
        api_key=ns.api_key,
        health_check_interval_s=ns.health_check_interval_secs,
        request_timeout_s=ns.request_timeout_secs,
    )
    return run_router(config, ns.host, ns.port, ns.log_level)


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
        if ns.command == "router":
            return router(ns)
        return generate(ns)
    except InvalidRequestError as e:
        print(f"radixgen: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
