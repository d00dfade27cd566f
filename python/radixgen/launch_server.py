"""`python -m radixgen.launch_server --model-path ... --port 30000`: SGLang's launch command, here.

Same flags as `radixgen serve`.
"""

from __future__ import annotations

import argparse
import sys

from radixgen.server_args import add_cli_args, from_cli_namespace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m radixgen.launch_server",
        description="Start the RadixGen HTTP server (SGLang native API + OpenAI-compatible API). "
        "/health answers 503 until the model is loaded; SIGINT / SIGTERM stop every process.",
    )
    add_cli_args(parser)
    ns = parser.parse_args(argv)
    from radixgen.errors import InvalidRequestError
    from radixgen.runtime.entrypoints.http_server import run_server

    try:
        return run_server(from_cli_namespace(ns))
    except InvalidRequestError as e:
        print(f"radixgen: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
