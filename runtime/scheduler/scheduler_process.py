"""Entry point of the scheduler process: ZMQ in, `Scheduler.step()` loop, ZMQ out."""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from radixgen.io_struct import SchedulerReadyOut
from radixgen.runtime.process_utils import PortArgs, configure_child_process
from radixgen.server_args import ServerArgs

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 1000
GRAMMAR_POLL_MS = 2


def choose_num_threads(args: ServerArgs) -> int:
    """Intra-op threads: the flag if set, else every core this process may run on."""
    from radixgen.runtime.model_executor.model_runner import available_cores

    if args.scheduler.num_threads:
        return args.scheduler.num_threads
    return available_cores()


def run_scheduler_process(
    args: ServerArgs, model_folder: str, ports: PortArgs, ready_pipe: Any
) -> None:
    configure_child_process("scheduler", args.http.log_level)
    t0 = time.perf_counter()
    try:
        import torch
        import zmq

        threads = choose_num_threads(args)
        torch.set_num_threads(threads)
        from radixgen.runtime.scheduler.scheduler import Scheduler

        scheduler = Scheduler(args, model_folder)
        ctx = zmq.Context(1)
        recv = ctx.socket(zmq.PULL)
        recv.bind(ports.scheduler_input_ipc)
        to_detok = ctx.socket(zmq.PUSH)
        to_detok.connect(ports.detokenizer_ipc)
        to_tokenizer = ctx.socket(zmq.PUSH)
        to_tokenizer.connect(ports.tokenizer_ipc)
        runner = scheduler.model_runner
        ready = SchedulerReadyOut(
            max_total_num_tokens=runner.kv_pool.size,
            max_req_input_len=min(scheduler.context_length, runner.kv_pool.size) - 1,
            context_length=scheduler.context_length,
            vocab_size=scheduler.vocab_size,
            num_threads=threads,
            startup_seconds=time.perf_counter() - t0,
            dtype=str(runner.dtype).replace("torch.", ""),
        )
    except Exception as e:
        ready_pipe.send({"status": "error", "error": f"{e!r}\n{traceback.format_exc()}"})
        raise
    ready_pipe.send({"status": "ready", "info": ready})
    ready_pipe.close()
    logger.info("scheduler ready in %.1f s (%d threads)", ready.startup_seconds, threads)

    poller = zmq.Poller()
    poller.register(recv, zmq.POLLIN)
    while True:
        if not scheduler.has_work:
            timeout = GRAMMAR_POLL_MS if scheduler.grammar_waiting else IDLE_POLL_MS
            poller.poll(timeout)
        while True:
            try:
                msg = recv.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                reply = scheduler.handle(msg)
            except Exception as e:  # NOTE: a bad message must not kill the loop
                logger.error(
                    "failed to handle %s: %s\n%s", type(msg).__name__, e, traceback.format_exc()
                )
                continue
            if reply is not None:
                to_tokenizer.send_pyobj(reply)
        for out in scheduler.step():
            to_detok.send_pyobj(out)
