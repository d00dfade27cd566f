"""Entry point of the scheduler process: build the scheduler's parts, then ZMQ in, `step()`, ZMQ out."""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import TYPE_CHECKING

from radixgen.errors import InvalidRequestError
from radixgen.io_struct import SchedulerReadyOut
from radixgen.runtime.launch.process_utils import (
    PortArgs,
    ReadyPipe,
    configure_child_process,
    doorbell_endpoint,
)
from radixgen.runtime.models.encoder_config import is_encoder_folder, serves_embeddings
from radixgen.runtime.scheduler.step_interrupt import CUT_WAIT_MS, StepInterrupt
from radixgen.runtime.text.rerank_prompt import parse_reranker_tokens
from radixgen.server_args import ServerArgs

if TYPE_CHECKING:
    from radixgen.runtime.distributed.parallel_state import TensorParallelGroup
    from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 1000
GRAMMAR_POLL_MS = 2
DP_ATTENTION_POLL_MS = 5
# NOTE: the queue empty this long: the step memory goes back to the OS (`release_idle_memory`);
# within a stream of requests it stays (the next batch would fault the same pages back in)
IDLE_RELEASE_S = 0.5


def choose_num_threads(args: ServerArgs) -> int:
    """Intra-op threads: the flag if set, else this replica's share of the cores this process
    may run on (all of them without data parallelism)."""
    from radixgen.runtime.model_executor.resolution import available_cores

    if args.scheduler.num_threads:
        return args.scheduler.num_threads
    par = args.parallel
    # under DP attention the replicas are the ranks: dp_size processes in all
    procs = par.dp_size * (1 if par.enable_dp_attention else par.tp_size)
    return max(1, available_cores() // procs)


def resolve_context_length(requested: int | None, model_max: int) -> int:
    """The flag if given (a warning past the model's own limit), else the model's limit."""
    if requested and requested > model_max:
        logger.warning("context_length %d exceeds the model's %d", requested, model_max)
    return requested or model_max


def create_prefix_cache(
    args: ServerArgs,
    req_to_token_pool: ReqToTokenPool,
    kv_pool: TokenToKVPool,
    model_folder: str | None = None,
) -> BasePrefixCache:
    """The radix tree, over a host tier (and a file tier) with `--enable-hierarchical-cache`,
    or the no-sharing chunk cache with `--disable-radix-cache`. `model_folder` goes into the
    file tier's KV validity digest."""
    from radixgen.kernels.kv_quant import resolve_kv_cache_format
    from radixgen.runtime.mem_cache.chunk_cache import ChunkCache
    from radixgen.runtime.mem_cache.file_tier import FileKVTier, kv_validity_digest, model_identity
    from radixgen.runtime.mem_cache.hiradix_cache import HiRadixCache, host_block_tokens
    from radixgen.runtime.mem_cache.host_codec import HostCompression
    from radixgen.runtime.mem_cache.host_tier import HostKVTier
    from radixgen.runtime.mem_cache.radix_cache import RadixCache

    cache = args.cache
    if cache.disable_radix_cache:
        return ChunkCache(req_to_token_pool, kv_pool)
    if not cache.enable_hierarchical_cache:
        return RadixCache(req_to_token_pool, kv_pool, cache.page_size)
    compression = None
    host_bytes_per_token = kv_pool.bytes_per_token()
    if cache.hicache_host_kv_dtype != "auto":
        fmt = resolve_kv_cache_format(cache.hicache_host_kv_dtype, kv_pool.dtype)
        compression = HostCompression(fmt, kv_pool.k_buffer.dtype)
        k = kv_pool.k_buffer
        host_bytes_per_token = fmt.bytes_per_token(k.shape[0], k.shape[2], k.shape[3])
    if cache.hicache_size > 0:
        host_bytes = cache.hicache_size * 2**30
    else:  # the ratio is of memory: a compressed tier holds more tokens in it
        host_bytes = cache.hicache_ratio * kv_pool.size * kv_pool.bytes_per_token()
    block = host_block_tokens(cache.page_size)
    host_tokens = int(host_bytes // host_bytes_per_token)
    host = HostKVTier(host_tokens // block, block, compression=compression)
    files = None
    if cache.hicache_storage_backend == "file":
        k = kv_pool.k_buffer
        validity = kv_validity_digest(
            {
                "model": model_identity(model_folder),
                "dtype": str(kv_pool.dtype),
                "kv_format": kv_pool.kv_format.name,
                "kv_shape": [k.shape[0], k.shape[2], k.shape[3]],  # layers, kv heads, head dim
                "page_size": cache.page_size,
                "block_tokens": block,
                "tp_size": args.parallel.tp_size,
                "quantization": args.model.quantization,
                "format": 1,
            }
        )
        files = FileKVTier(cache.hicache_file_dir, int(cache.hicache_file_size * 2**30), validity)
    return HiRadixCache(
        req_to_token_pool, kv_pool, cache.page_size, host, files, cache.hicache_write_policy
    )


def build_scheduler(
    args: ServerArgs, model_folder: str, tp: TensorParallelGroup | None = None
) -> Scheduler:
    """Load the model, tokenizer, cache and grammar backend, and hand them to a Scheduler
    (tp: rank 0 of a tensor-parallel group; its runner then leads the other ranks' steps)."""
    from radixgen.runtime.model_executor.model_runner import ModelRunner
    from radixgen.runtime.models.model_config import ModelArchConfig
    from radixgen.runtime.scheduler.scheduler import ModelLimits, Scheduler
    from radixgen.runtime.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_folder, args.model.tokenizer_path, args.model.chat_template)
    arch = ModelArchConfig.from_folder(model_folder)
    context_length = resolve_context_length(args.model.context_length, arch.max_position_embeddings)
    limits = ModelLimits(
        context_length, arch.vocab_size, list(arch.eos_token_ids or tokenizer.eos_token_ids)
    )
    # NOTE: the grammar backend (importing xgrammar: ~1.2 s) is built on a thread after the
    # ready report (`_serve`), not here: a server that never sees a constrained request does
    # not wait for it, and the first one that comes early waits only for the rest of that
    # build. On a thread beside the model's load it cost the start ~1 s of GIL contention.
    grammar_manager = None
    if args.grammar.grammar_backend != "none":
        from radixgen.runtime.constrained.grammar_manager import GrammarManager

        grammar_manager = GrammarManager(
            args.grammar, tokenizer, limits.vocab_size, limits.eos_token_ids
        )
    runner = ModelRunner(model_folder, args, context_length, arch, tp)
    if tp is not None and runner.dp_sync is None:
        from radixgen.runtime.distributed.tp_worker import StepChannel

        runner.step_channel = StepChannel(tp)
    cache = create_prefix_cache(args, runner.req_to_token_pool, runner.kv_pool, model_folder)
    return Scheduler(args, runner, tokenizer, cache, grammar_manager, limits)


def tp_init_method(args: ServerArgs, ports: PortArgs, dp_rank: int) -> str:
    """Where the ranks of one tensor-parallel group meet: a file store in the server's private
    IPC folder on one machine (no port to race for), `--dist-init-addr` across machines."""
    par = args.parallel
    if par.dist_init_addr:
        return f"tcp://{par.dist_init_addr}"
    if par.enable_dp_attention:  # one group across the replicas
        return f"file://{ports.ipc_dir}/dp-attention.store"
    return f"file://{ports.ipc_dir}/tp-{dp_rank}.store"


def scheduler_process_name(args: ServerArgs, dp_rank: int, tp_rank: int) -> str:
    name = "scheduler" if args.parallel.dp_size == 1 else f"scheduler dp{dp_rank}"
    par = args.parallel
    return name if par.tp_size == 1 or par.enable_dp_attention else f"{name} tp{tp_rank}"


def run_scheduler_process(
    args: ServerArgs,
    model_folder: str,
    ports: PortArgs,
    ready_pipe: ReadyPipe,
    dp_rank: int = 0,
    tp_rank: int = 0,
) -> None:
    """One scheduler (tp rank 0), or one follower rank of a tensor-parallel group."""
    configure_child_process(scheduler_process_name(args, dp_rank, tp_rank), args.http.log_level)
    from radixgen.runtime.distributed.parallel_state import CollectiveError, TensorParallelGroup

    t0 = time.perf_counter()
    tp: TensorParallelGroup | None = None
    try:
        import torch

        threads = choose_num_threads(args)
        torch.set_num_threads(threads)
        par = args.parallel
        if par.tp_size > 1:
            init = tp_init_method(args, ports, dp_rank)
            rank = dp_rank if par.enable_dp_attention else tp_rank
            tp = TensorParallelGroup(rank, par.tp_size, init, par.dist_timeout)
        if serves_embeddings(args.model.is_embedding, model_folder):
            _serve_embeddings(args, model_folder, ports, ready_pipe, dp_rank, threads, t0)
            return
        if tp is not None and not tp.is_first and not par.enable_dp_attention:
            _run_follower_rank(args, model_folder, ready_pipe, tp, t0)
            return
        _serve(args, model_folder, ports, ready_pipe, dp_rank, tp, threads, t0)
    except CollectiveError as e:
        # NOTE: fatal for the whole group: the launcher sees this process exit and stops the
        # server with this reason in the log (no rank is left waiting on the others)
        logger.error("%s: stopping this rank", e)
        if tp is None:  # failed while joining: the launcher is still waiting for the report
            ready_pipe.send({"status": "error", "error": str(e)})
        logging.shutdown()
        os._exit(1)


def _run_follower_rank(
    args: ServerArgs,
    model_folder: str,
    ready_pipe: ReadyPipe,
    tp: TensorParallelGroup,
    t0: float,
) -> None:
    """Ranks 1..T-1: the model shard and its KV pool only; rank 0 drives every step."""
    from radixgen.runtime.distributed.tp_worker import run_follower
    from radixgen.runtime.model_executor.model_runner import ModelRunner
    from radixgen.runtime.models.model_config import ModelArchConfig

    try:
        arch = ModelArchConfig.from_folder(model_folder)
        context_length = resolve_context_length(
            args.model.context_length, arch.max_position_embeddings
        )
        runner = ModelRunner(model_folder, args, context_length, arch, tp)
    except Exception as e:
        ready_pipe.send({"status": "error", "error": f"{e!r}\n{traceback.format_exc()}"})
        raise
    ready_pipe.send({"status": "ready", "info": None})
    ready_pipe.close()
    logger.info("rank %d ready in %.1f s", tp.rank, time.perf_counter() - t0)
    tp.startup_barrier()
    run_follower(runner, tp)


def _serve(
    args: ServerArgs,
    model_folder: str,
    ports: PortArgs,
    ready_pipe: ReadyPipe,
    dp_rank: int,
    tp: TensorParallelGroup | None,
    threads: int,
    t0: float,
) -> None:
    import zmq

    from radixgen.runtime.model_executor.model_runner import ModelRunner

    try:
        scheduler = build_scheduler(args, model_folder, tp)
        ctx = zmq.Context(1)
        recv = ctx.socket(zmq.PULL)
        recv.bind(ports.scheduler_input_for(dp_rank))
        to_detok = ctx.socket(zmq.PUSH)
        to_detok.connect(ports.detokenizer_ipc)
        to_tokenizer = ctx.socket(zmq.PUSH)
        to_tokenizer.connect(ports.tokenizer_ipc)
        runner = scheduler.model_runner
        assert isinstance(runner, ModelRunner)
        # steps of batch lines are cut for interactive arrivals where the forward runs inline
        # and alone: a CPU, one tensor-parallel rank, no DP attention (step_interrupt.py)
        if tp is None and runner.dp_sync is None and runner.torch_device.type == "cpu":
            scheduler.interrupt = StepInterrupt()
            scheduler.interrupt.listen(ctx, doorbell_endpoint(ports.scheduler_input_for(dp_rank)))
        ready = SchedulerReadyOut(
            max_total_num_tokens=runner.kv_pool.size,
            max_req_input_len=scheduler.max_request_tokens - 1,
            context_length=scheduler.context_length,
            vocab_size=scheduler.vocab_size,
            num_threads=threads,
            startup_seconds=time.perf_counter() - t0,
            dtype=str(runner.dtype).replace("torch.", ""),
            dp_rank=dp_rank,
            quantization=runner.quantization,
            kernel_isa=runner.native.isa if runner.native is not None else None,
            kernel_act_quant=(
                runner.native.act_quant_active if runner.native is not None else None
            ),
            kernel_wide_rows=runner.wide_rows,
            interruptible=scheduler.interrupt is not None,
        )
    except Exception as e:
        ready_pipe.send({"status": "error", "error": f"{e!r}\n{traceback.format_exc()}"})
        raise
    ready_pipe.send({"status": "ready", "info": ready})
    ready_pipe.close()
    logger.info("scheduler ready in %.1f s (%d threads)", ready.startup_seconds, threads)
    if scheduler.grammar_manager is not None:
        scheduler.grammar_manager.start_warm_up()

    if tp is not None:
        tp.startup_barrier()
    channel, dp_sync = runner.step_channel, runner.dp_sync
    # NOTE: under DP attention every iteration meets the other ranks' (a count gather), so an
    # idle rank polls briefly: a long sleep here would stall a busy rank's next step
    idle_ms = DP_ATTENTION_POLL_MS if dp_sync is not None else IDLE_POLL_MS
    poller = zmq.Poller()
    poller.register(recv, zmq.POLLIN)
    released_at = -1  # scheduler.forward_steps when step memory was last given back
    idle_since: float | None = None  # when the queue last became empty
    while True:
        if scheduler.has_work:
            idle_since = None
            if scheduler.last_step_cut:  # for the request that rang (it may trail its ring)
                poller.poll(CUT_WAIT_MS)
        else:
            now = time.monotonic()
            idle_since = now if idle_since is None else idle_since
            if released_at != scheduler.forward_steps and now - idle_since >= IDLE_RELEASE_S:
                runner.release_idle_memory()  # ~1-25 ms
                released_at = scheduler.forward_steps
            timeout = GRAMMAR_POLL_MS if scheduler.grammar_waiting else idle_ms
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
        if channel is not None:
            channel.keepalive()
        if dp_sync is not None:
            dp_sync.end_iteration(runner.model, runner.cfg.hidden_size, runner.dtype)


def reranker_answer_ids(args: ServerArgs, model_folder: str) -> tuple[int, int] | None:
    """The token ids of --reranker-tokens' two answers (each must be one token), or None."""
    from radixgen.runtime.text.tokenizer import load_tokenizer

    if args.model.reranker_tokens is None:
        return None
    tokenizer = load_tokenizer(model_folder, args.model.tokenizer_path, None)
    ids = []
    for answer in parse_reranker_tokens(args.model.reranker_tokens):
        encoded = tokenizer.encode(answer, add_special_tokens=False)
        if len(encoded) != 1:
            raise InvalidRequestError(
                f"--reranker-tokens: {answer!r} is {len(encoded)} tokens for this tokenizer (it "
                "must be one)",
                "reranker_tokens",
            )
        ids.append(encoded[0])
    return ids[0], ids[1]


def _serve_embeddings(
    args: ServerArgs,
    model_folder: str,
    ports: PortArgs,
    ready_pipe: ReadyPipe,
    dp_rank: int,
    threads: int,
    t0: float,
) -> None:
    """An embedding model's loop: requests in, one batch a step, vectors straight back to the
    TokenizerManager (there is no text to detokenize)."""
    import zmq

    from radixgen.runtime.model_executor.decoder_embedding_runner import DecoderEmbeddingRunner
    from radixgen.runtime.model_executor.embedding_runner import (
        EmbeddingRunner,
        encoder_device,
        encoder_dtype,
    )
    from radixgen.runtime.scheduler.embedding_scheduler import EmbeddingScheduler

    try:
        runner: EmbeddingRunner | DecoderEmbeddingRunner
        if is_encoder_folder(model_folder):
            runner = EmbeddingRunner(
                model_folder,
                encoder_dtype(args.model.dtype),
                encoder_device(args.model.device),
                args.model.pooling,
            )
        else:  # a decoder asked to embed (--is-embedding): last-token pooling, or yes/no odds
            runner = DecoderEmbeddingRunner(
                model_folder, args, args.model.pooling, reranker_answer_ids(args, model_folder)
            )
        scheduler = EmbeddingScheduler(runner, args.scheduler.max_prefill_tokens)
        ctx = zmq.Context(1)
        recv = ctx.socket(zmq.PULL)
        recv.bind(ports.scheduler_input_for(dp_rank))
        to_tokenizer = ctx.socket(zmq.PUSH)
        to_tokenizer.connect(ports.tokenizer_ipc)
        ready = SchedulerReadyOut(
            max_total_num_tokens=scheduler.max_step_tokens,
            max_req_input_len=runner.max_input_tokens,
            context_length=runner.max_input_tokens,
            vocab_size=runner.vocab_size,
            num_threads=threads,
            startup_seconds=time.perf_counter() - t0,
            dtype=str(runner.dtype).replace("torch.", ""),
            dp_rank=dp_rank,
            embedding_dim=runner.hidden_size,
            cross_encoder=runner.is_cross_encoder,
        )
    except Exception as e:
        ready_pipe.send({"status": "error", "error": f"{e!r}\n{traceback.format_exc()}"})
        raise
    ready_pipe.send({"status": "ready", "info": ready})
    ready_pipe.close()
    logger.info("embedding scheduler ready in %.1f s (%d threads)", ready.startup_seconds, threads)
    while True:
        if not scheduler.has_work:
            recv.poll(IDLE_POLL_MS)
        while True:
            try:
                msg = recv.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                reply = scheduler.handle(msg)
            except Exception as e:  # NOTE: a bad message must not kill the loop
                logger.error("failed to handle %s: %s", type(msg).__name__, e)
                continue
            if reply is not None:
                to_tokenizer.send_pyobj(reply)
        try:
            outputs = scheduler.step()
        except Exception as e:  # NOTE: last resort, for a bug outside step()'s own containment
            logger.error("embedding step failed: %s\n%s", e, traceback.format_exc())
            outputs = scheduler.fail_all(e)
        for out in outputs:
            to_tokenizer.send_pyobj(out)
