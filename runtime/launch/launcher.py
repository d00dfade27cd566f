"""Start and stop the engine's child processes (scheduler, detokenizer) and watch their health.

Runs in the API process (server) or the user's process (offline Engine). The model path is
resolved (and a GGUF converted) here once, before any child starts; each child is a fresh
interpreter (`radixgen.runtime.launch.child_main`) that reports ready or its start-up error over ZMQ;
shutdown stops every child, and children exit when the parent dies (they watch its pid: see
`process_utils.configure_child_process`).
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from radixgen.errors import EngineDeadError, InvalidRequestError
from radixgen.io_struct import SchedulerReadyOut
from radixgen.runtime.distributed.shard_plan import check_dp_attention_shape, check_tp_shape
from radixgen.runtime.launch.child_main import scheduler_role
from radixgen.runtime.launch.process_utils import PortArgs, remove_stale_ipc_dirs
from radixgen.runtime.model_loader.resolve import default_served_name, resolve_model_path
from radixgen.runtime.models.encoder_config import serves_embeddings
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.runtime.text.rerank_prompt import parse_reranker_tokens, rerank_template
from radixgen.runtime.text.tokenizer import chat_template_text, tokenizer_folder
from radixgen.server_args import ServerArgs

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0


def child_argvs(
    dp_size: int, spec_path: str, tp_size: int = 1, tp_ranks: range | None = None
) -> dict[str, list[str]]:
    """Each child's role name -> its `child_main` arguments: one scheduler per data-parallel
    replica (`scheduler`, `scheduler-1`, ...; replica 0 is started exactly as without DP) times
    its tensor-parallel ranks (`scheduler-tp1`, ...), and one detokenizer, which every replica
    sends to. tp_ranks: the ranks this machine runs (multi-node); the detokenizer runs where
    rank 0 does."""
    ranks = tp_ranks if tp_ranks is not None else range(tp_size)
    argvs: dict[str, list[str]] = {}
    for dp in range(dp_size):
        for tp in ranks:
            extra = [str(dp), str(tp)] if tp else ([str(dp)] if dp else [])
            argvs[scheduler_role(dp, tp)] = ["scheduler", spec_path, *extra]
    if 0 in ranks:
        argvs["detokenizer"] = ["detokenizer", spec_path]
    return argvs


def followers_per_replica(args: ServerArgs) -> int:
    """Scheduler processes per DP replica: its TP ranks; 1 under DP attention, where each rank
    is a replica of its own (the group spans the replicas)."""
    par = args.parallel
    return 1 if par.enable_dp_attention else par.tp_size


def node_ranks(args: ServerArgs) -> range:
    """The tensor-parallel ranks this machine runs: its slice of --tp-size over --nnodes."""
    par = args.parallel
    per_node = followers_per_replica(args) // par.nnodes
    return range(par.node_rank * per_node, (par.node_rank + 1) * per_node)


@dataclass
class EngineProcesses:
    args: ServerArgs
    model_folder: str
    served_model_name: str
    ports: PortArgs
    ready: SchedulerReadyOut | None
    procs: dict[str, subprocess.Popen[bytes]]
    # every replica's report, by dp rank (`ready` is replica 0's: they load the same model)
    replicas: list[SchedulerReadyOut] = field(default_factory=list)

    def dead_child(self) -> str | None:
        """Name and exit code of a child that died, if any."""
        for role, p in self.procs.items():
            code = p.poll()
            if code is not None:
                return f"the {role} process exited with code {code}"
        return None

    def shutdown(self, timeout: float = 5.0) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(2.0)
        self.ports.remove()


def launch_engine_processes(args: ServerArgs) -> EngineProcesses:
    """Resolve the model, start scheduler + detokenizer, wait until both are ready."""
    embedding = args.model.is_embedding
    model_folder = resolve_model_path(args.model.model_path, embedding)
    # NOTE: bad tokenizer / chat-template flags fail here, before any child starts
    tokenizer_folder(model_folder, args.model.tokenizer_path)
    chat_template_text(args.model.chat_template)
    if args.model.reranker_tokens is not None:
        parse_reranker_tokens(args.model.reranker_tokens)
        rerank_template(args.model.rerank_template)
    served = args.model.served_model_name or default_served_name(args.model.model_path, embedding)
    if serves_embeddings(embedding, model_folder) and args.parallel.tp_size > 1:
        raise InvalidRequestError("an embedding model runs on one rank: use --tp-size 1", "tp_size")
    for name, path in args.lora.named_paths():  # a missing adapter fails before any start too
        if not (Path(path).expanduser() / "adapter_config.json").is_file():
            raise InvalidRequestError(
                f"LoRA adapter {name!r}: {path} holds no adapter_config.json", "lora_paths"
            )
    if args.parallel.tp_size > 1:  # a split the model's shape refuses fails before any start
        check = check_dp_attention_shape if args.parallel.enable_dp_attention else check_tp_shape
        check(ModelArchConfig.from_folder(model_folder), args.parallel.tp_size)
    for path in remove_stale_ipc_dirs():
        logger.info("removed %s, left behind by a server that is gone", path)
    ports = PortArgs.create()
    ready_endpoint = f"ipc://{ports.ipc_dir}/ready"
    ctx = zmq.Context(1)
    ready_sock = ctx.socket(zmq.PULL)
    ready_sock.bind(ready_endpoint)
    spec = {
        "args": args,
        "model_folder": model_folder,
        "ports": ports,
        "ready_endpoint": ready_endpoint,
        "tokenizer_path": args.model.tokenizer_path,
        "chat_template": args.model.chat_template,
        "log_level": args.http.log_level,
    }
    spec_path = os.path.join(ports.ipc_dir, "spec.pkl")
    with open(spec_path, "wb") as f:
        pickle.dump(spec, f)
    env = {**os.environ, "RADIXGEN_PARENT_PID": str(os.getpid())}
    # NOTE: idle OpenMP workers spin briefly, then sleep. Spinning forever (libgomp's default
    # 300k spins) starves the working thread when anything else shares the cores: measured here
    # under load, a small matmul took 13 ms with 2 spinning threads and 0.2 ms with passive ones.
    # Sleeping at once (OMP_WAIT_POLICY=PASSIVE) costs a wake-up per op on a quiet machine:
    # single-stream decode fell from 26 to 18 tok/s. A short spin keeps both (26 quiet, and the
    # same as passive under load).
    if "OMP_WAIT_POLICY" not in env:
        env.setdefault("GOMP_SPINCOUNT", "10000")
    procs = {
        role: subprocess.Popen(
            [sys.executable, "-m", "radixgen.runtime.launch.child_main", *argv], env=env
        )
        for role, argv in child_argvs(
            args.parallel.dp_size, spec_path, followers_per_replica(args), node_ranks(args)
        ).items()
    }
    handle = EngineProcesses(args, model_folder, served, ports, None, procs)
    try:
        handle.replicas = _wait_ready(handle, ready_sock)
        # NOTE: a machine other than the first runs no scheduler (no report): it only follows
        handle.ready = handle.replicas[0] if handle.replicas else None
    except BaseException:
        handle.shutdown()
        raise
    finally:
        ready_sock.close(linger=0)
        ctx.term()
    return handle


def _wait_ready(handle: EngineProcesses, sock: zmq.Socket[bytes]) -> list[SchedulerReadyOut]:
    """Every child's ready report; returns the schedulers' reports by dp rank."""
    waiting = set(handle.procs)
    ready: dict[int, SchedulerReadyOut] = {}
    deadline = time.monotonic() + START_TIMEOUT_S
    while waiting:
        if time.monotonic() > deadline:
            raise EngineDeadError(f"start-up timed out waiting for {sorted(waiting)}")
        if sock.poll(200):
            msg = sock.recv_pyobj()
            if msg.get("status") != "ready":
                raise EngineDeadError(
                    f"the {msg.get('role')} process failed to start: {msg.get('error')}"
                )
            waiting.discard(msg["role"])
            info: SchedulerReadyOut | None = msg.get("info")
            if info is not None:  # a scheduler (tensor-parallel followers report none)
                ready[info.dp_rank] = info
            continue
        dead = handle.dead_child()
        if dead:
            raise EngineDeadError(f"{dead} during start-up")
    return [ready[rank] for rank in sorted(ready)]
