"""`python -m radixgen.launch_server --model-path ... --port 30000`: SGLang's launch command, here.

Same flags as `radixgen serve`, SGLang's other launch flags included (`sglang_flags`).
"""

from __future__ import annotations

import argparse
import sys

from radixgen.config_file import expand_config_file
from radixgen.errors import InvalidRequestError
from radixgen.server_args import add_cli_args, from_cli_namespace
from radixgen.sglang_flags import DOC_PATH, foreign_flag_notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m radixgen.launch_server",
        description="Start the RadixGen HTTP server (SGLang native API + OpenAI-compatible API). "
        "/health answers 503 until the model is loaded; SIGINT / SIGTERM stop every process.",
        epilog=f"SGLang's other launch flags are accepted too: {DOC_PATH} says which have no "
        "effect here (a startup-log warning each) and which are refused, and why.",
    )
    add_cli_args(parser)
    try:
        argv = expand_config_file(list(sys.argv[1:] if argv is None else argv))
    except InvalidRequestError as e:
        print(f"radixgen: error: {e}", file=sys.stderr)
        return 2
    ns = parser.parse_args(argv)
    from radixgen.runtime.entrypoints.http_server import run_server

    try:
        args = from_cli_namespace(ns)
        return run_server(args, foreign_flag_notes(ns))
    except InvalidRequestError as e:
        print(f"radixgen: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
