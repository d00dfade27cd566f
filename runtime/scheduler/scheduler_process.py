"""Entry point of the scheduler process: build the scheduler's parts, then ZMQ in, `step()`, ZMQ out."""

from __future__ import annotations

import logging
import time
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from radixgen.io_struct import SchedulerReadyOut
from radixgen.runtime.launch.process_utils import PortArgs, configure_child_process
from radixgen.server_args import ServerArgs

if TYPE_CHECKING:
    from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 1000
GRAMMAR_POLL_MS = 2


def choose_num_threads(args: ServerArgs) -> int:
    """Intra-op threads: the flag if set, else this replica's share of the cores this process
    may run on (all of them without data parallelism)."""
    from radixgen.runtime.model_executor.model_runner import available_cores

    if args.scheduler.num_threads:
        return args.scheduler.num_threads
    return max(1, available_cores() // args.parallel.dp_size)


def resolve_context_length(requested: int | None, model_max: int) -> int:
    """The flag if given (a warning past the model's own limit), else the model's limit."""
    if requested and requested > model_max:
        logger.warning("context_length %d exceeds the model's %d", requested, model_max)
    return requested or model_max


def create_prefix_cache(
    args: ServerArgs, req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool
) -> BasePrefixCache:
    """The radix tree, or the no-sharing chunk cache with `--disable-radix-cache`."""
    from radixgen.runtime.mem_cache.chunk_cache import ChunkCache
    from radixgen.runtime.mem_cache.radix_cache import RadixCache

    if args.cache.disable_radix_cache:
        return ChunkCache(req_to_token_pool, kv_pool)
    return RadixCache(req_to_token_pool, kv_pool, args.cache.page_size)


def build_scheduler(args: ServerArgs, model_folder: str) -> Scheduler:
    """Load the model, tokenizer, cache and grammar backend, and hand them to a Scheduler."""
    from radixgen.runtime.model_executor.model_runner import ModelRunner
    from radixgen.runtime.models.model_config import ModelArchConfig
    from radixgen.runtime.scheduler.scheduler import ModelLimits, Scheduler
    from radixgen.runtime.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_folder, args.model.tokenizer_path, args.model.chat_template)
    arch = ModelArchConfig.from_folder(model_folder)
    context_length = resolve_context_length(args.model.context_length, arch.max_position_embeddings)
    runner = ModelRunner(model_folder, args, context_length, arch)
    cache = create_prefix_cache(args, runner.req_to_token_pool, runner.kv_pool)
    limits = ModelLimits(
        context_length, arch.vocab_size, list(arch.eos_token_ids or tokenizer.eos_token_ids)
    )
    grammar_manager = None
    if args.grammar.grammar_backend != "none":
        from radixgen.runtime.constrained.grammar_manager import GrammarManager

        grammar_manager = GrammarManager(
            args.grammar, tokenizer, limits.vocab_size, limits.eos_token_ids
        )
    return Scheduler(args, runner, tokenizer, cache, grammar_manager, limits)


def run_scheduler_process(
    args: ServerArgs,
    model_folder: str,
    ports: PortArgs,
    ready_pipe: Connection,
    dp_rank: int = 0,
) -> None:
    name = "scheduler" if args.parallel.dp_size == 1 else f"scheduler dp{dp_rank}"
    configure_child_process(name, args.http.log_level)
    t0 = time.perf_counter()
    try:
        import torch
        import zmq

        threads = choose_num_threads(args)
        torch.set_num_threads(threads)
        from radixgen.runtime.model_executor.model_runner import ModelRunner

        scheduler = build_scheduler(args, model_folder)
        ctx = zmq.Context(1)
        recv = ctx.socket(zmq.PULL)
        recv.bind(ports.scheduler_input_for(dp_rank))
        to_detok = ctx.socket(zmq.PUSH)
        to_detok.connect(ports.detokenizer_ipc)
        to_tokenizer = ctx.socket(zmq.PUSH)
        to_tokenizer.connect(ports.tokenizer_ipc)
        runner = scheduler.model_runner
        assert isinstance(runner, ModelRunner)
        ready = SchedulerReadyOut(
            max_total_num_tokens=runner.kv_pool.size,
            max_req_input_len=scheduler.max_request_tokens - 1,
            context_length=scheduler.context_length,
            vocab_size=scheduler.vocab_size,
            num_threads=threads,
            startup_seconds=time.perf_counter() - t0,
            dtype=str(runner.dtype).replace("torch.", ""),
            dp_rank=dp_rank,
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
        try:
            outputs = scheduler.step()
        except Exception as e:  # NOTE: last resort, for a bug outside step()'s own containment
            logger.error("scheduler step failed: %s\n%s", e, traceback.format_exc())
            outputs = scheduler.fail_all(e)
        for out in outputs:
            to_detok.send_pyobj(out)
