"""`--node-rank K` (K >= 1) of a `--nnodes N` server: this machine's tensor-parallel ranks only.

Runs in the launch process of a machine other than the first. Its ranks hold their model shards
and follow rank 0's steps (they need no ZMQ: rank 0, on machine 0, alone talks to the API and the
detokenizer); this process starts them, answers `/health` once they are ready, and exits when
any of them does: rank 0 stopping (machine 0's server shut down or died) ends every collective
of theirs, so the whole group goes down together.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from radixgen.errors import EngineDeadError
from radixgen.runtime.launch.launcher import launch_engine_processes
from radixgen.runtime.launch.process_utils import configure_logging
from radixgen.server_args import ServerArgs

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path in ("/health", "/ping")
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"status": "ok", "role": "worker node"}' if ok else b"{}")

    def log_message(self, format: str, *args: object) -> None:
        return


def run_worker_node(args: ServerArgs) -> int:
    """Start this node's ranks, serve /health, and return when they stop (1) or on SIGTERM (0)."""
    par = args.parallel
    configure_logging(args.http.log_level, f"node {par.node_rank}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        procs = launch_engine_processes(args)
    except EngineDeadError as e:  # e.g. rank 0's machine never came within --dist-timeout
        logger.error("node %d could not start: %s", par.node_rank, e)
        return 1
    health = ThreadingHTTPServer((args.http.host, args.http.port), _Health)
    threading.Thread(target=health.serve_forever, name="health", daemon=True).start()
    logger.info(
        "node %d of %d: tensor-parallel ranks ready, following rank 0 at %s; /health on %s:%d",
        par.node_rank, par.nnodes, par.dist_init_addr, args.http.host, args.http.port,
    )  # fmt: skip
    code = 0
    try:
        while not stop.is_set():
            dead = procs.dead_child()
            if dead:
                logger.error("%s: this node stops", dead)
                code = 1
                break
            time.sleep(WATCH_INTERVAL_S)
    except KeyboardInterrupt:
        code = 130
    finally:
        health.shutdown()
        procs.shutdown()
    return code
