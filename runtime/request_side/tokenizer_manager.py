"""TokenizerManager (API process, asyncio): validate, tokenize, send to the scheduler, route outputs by rid.

Used by the HTTP server and by the offline Engine alike. Each request has a `ReqState`
(`req_state.py`) that the receive loop updates from the detokenizer's `BatchStrOut`; consumers
wait on its event and read a snapshot, so a slow consumer never loses text or logprobs (deltas
are sliced from what it has seen). Messages to the scheduler(s) go through a `SchedulerLink`:
the one scheduler, or the DP controller in front of `--dp-size` replicas.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import zmq
import zmq.asyncio

from radixgen.errors import (
    EngineDeadError,
    InternalError,
    InvalidRequestError,
    QueueFullError,
)
from radixgen.finish_reason import FinishReason
from radixgen.generate_output import GenerateOutput
from radixgen.grammar_limits import GrammarSpecLimits
from radixgen.internal_state import InternalState, summed_internal_state
from radixgen.io_struct import (
    AbortReq,
    BatchEmbeddingOut,
    BatchStrOut,
    ControlReply,
    ControlRequest,
    DashboardSnapshot,
    DashboardSnapshotOut,
    DashboardSnapshotReq,
    FlushCacheOut,
    FlushCacheReq,
    GenerateReqInput,
    GetInternalStateOut,
    GetInternalStateReq,
    LoadLoraAdapterReq,
    LoraAdapterOut,
    MessageDispatch,
    SchedulerReadyOut,
    TokenizedEmbeddingReq,
    TokenizedGenerateReq,
    TokenizerInbound,
    UnloadLoraAdapterReq,
    apply_delta,
)
from radixgen.runtime.dashboard.traces import ProgramTraceStore
from radixgen.runtime.launch.process_utils import PortArgs
from radixgen.runtime.request_side.dp_router import DataParallelController
from radixgen.runtime.request_side.embedding_requests import EmbeddingRequests, EmbeddingResult
from radixgen.runtime.request_side.req_state import ReqState, build_output
from radixgen.runtime.request_side.request_checks import RequestChecker, resolve_priority
from radixgen.runtime.request_side.request_limits import RequestLimits
from radixgen.runtime.request_side.request_log import RequestLogger
from radixgen.runtime.request_side.scheduler_client import SchedulerLink
from radixgen.runtime.text.rerank_prompt import rerank_prompt, rerank_template
from radixgen.runtime.text.tokenizer import load_tokenizer
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import ServerArgs

if TYPE_CHECKING:  # NOTE: prometheus_client is imported only where metrics are on
    from radixgen.runtime.request_side.metrics import ServerMetrics

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Retry-After of a 429 (queue full): on this hardware a running batch frees slots within seconds
QUEUE_RETRY_AFTER_S = 1
API_CPU_THREADS = 2  # worker threads for the API process's CPU work (see start())
# An abort naming a rid with no request yet (it raced the request's tokenization or an n > 1
# prompt prefill) is remembered this long, so the request ends as soon as it is submitted.
EARLY_ABORT_TTL_S = 30.0
EARLY_ABORT_MAX = 10_000


def _one(value: T | list[T] | None) -> T | None:
    """A field of one item of a split batch (`GenerateReqInput.item`): never a per-item list."""
    assert not isinstance(value, list), "a batch is split into its items before this"
    return value


class TokenizerManager:
    def __init__(
        self,
        args: ServerArgs,
        model_folder: str,
        ports: PortArgs,
        ready: SchedulerReadyOut,
        served_model_name: str,
    ) -> None:
        self.args = args
        self.model_folder = model_folder
        self.tokenizer = load_tokenizer(
            model_folder, args.model.tokenizer_path, args.model.chat_template
        )
        self.ready = ready
        self.served_model_name = served_model_name
        self.context_length = ready.context_length
        self.max_total_tokens = ready.max_total_num_tokens
        # prompt + max_new_tokens may not exceed this (the scheduler's own limit, from its ready)
        self.max_request_tokens = ready.max_req_input_len + 1
        self.vocab_size = ready.vocab_size
        self.grammar_limits = GrammarSpecLimits.from_config(args.grammar)
        self.ports = ports
        self.limits = RequestLimits(args.limits)
        self.checker = RequestChecker(
            self.tokenizer,
            self.limits,
            self.grammar_limits,
            self.vocab_size,
            self.context_length,
            self.max_request_tokens,
            args.parallel.dp_size,
        )
        # the LoRA adapters requests may name (--lora-paths; /load_lora_adapter adds one)
        self.lora_enabled = args.lora.enabled
        self.lora_paths: dict[str, str] = dict(args.lora.named_paths())
        self.states: dict[str, ReqState] = {}
        # the user's rid of an n > 1 request -> its samples' rids (so abort by that rid works)
        self.sample_rids: dict[str, list[str]] = {}
        self.dead_reason: str | None = None
        self.metrics: ServerMetrics | None = None  # set by the HTTP server when --enable-metrics
        self.program_traces = ProgramTraceStore()  # traced DSL runs, for the dashboard
        self.request_log = RequestLogger(args.http.log_requests, args.http.log_requests_level)
        self._early_aborts: dict[str, float] = {}  # rid -> monotonic time of its abort
        self._ctx: zmq.asyncio.Context | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.link: SchedulerLink | None = None  # set by start(): one scheduler or N replicas
        # an embedding server's requests in flight (None: the server generates text)
        self.embeddings: EmbeddingRequests | None = None
        if ready.embedding_dim is not None:
            self.embeddings = EmbeddingRequests(
                self._send_embedding,
                self._send_abort,
                ready.embedding_dim,
                ready.max_req_input_len,
                ready.vocab_size,
            )
        self._dispatch = self._message_dispatch()

    # --- wiring ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Open sockets and start the receive loop; call from the event loop that will serve."""
        self._ctx = zmq.asyncio.Context(1)
        self._recv = self._ctx.socket(zmq.PULL)
        self._recv.bind(self.ports.tokenizer_ipc)
        dp = self.args.parallel
        if dp.dp_size == 1:
            self.link = SchedulerLink(self._ctx, self.ports.scheduler_input_ipc)
        else:
            endpoints = [self.ports.scheduler_input_for(r) for r in range(dp.dp_size)]
            self.link = DataParallelController(self._ctx, endpoints, dp.load_balance_method)
        if self.ready.interruptible:  # plain sockets on the same ZMQ context
            self.link.open_doorbells(zmq.Context.shadow(self._ctx.underlying))
        loop = asyncio.get_running_loop()
        # NOTE: tokenizing, chat templates and big-body parsing go through asyncio.to_thread;
        # a small pool bounds that work: threads beyond the cores add no speed, only glibc malloc
        # arenas that each keep their peak (asyncio's default pool has cores + 4 threads).
        loop.set_default_executor(
            ThreadPoolExecutor(API_CPU_THREADS, thread_name_prefix="radixgen-api-cpu")
        )
        self._loop_task = loop.create_task(self._recv_loop())

    def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self._ctx is not None:
            if self.link is not None:
                self.link.close_doorbells()
            self._ctx.destroy(linger=0)
            self._ctx = None

    def mark_dead(self, reason: str) -> None:
        """A child process died: fail everything in flight, refuse new work."""
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        logger.error("engine is dead: %s", reason)
        self.fail_all(reason, 503)

    def fail_all(self, reason: str, status_code: int) -> None:
        """Finish every request in flight here with an abort (the engine is not told)."""
        if self.embeddings is not None:
            self.embeddings.fail_all(reason)
        for st in self.states.values():
            if not st.finished:
                st.finish_reason = FinishReason.abort(reason, status_code)
                st.event.set()

    @property
    def num_in_flight(self) -> int:
        """Users' requests not yet finished (a finished one may still be sending its answer)."""
        embedding = len(self.embeddings) if self.embeddings is not None else 0
        return embedding + sum(
            1 for st in self.states.values() if not st.finished and not st.internal
        )

    async def _recv_loop(self) -> None:
        while True:
            try:
                msg: TokenizerInbound = await self._recv.recv_pyobj()
                self._dispatch(msg)
            except zmq.ZMQError:
                logger.exception("the receive socket failed: outputs are no longer routed")
                return
            except Exception:  # NOTE: one bad message must not stop routing for everyone
                logger.exception("failed to receive or route a message")

    def _message_dispatch(self) -> MessageDispatch[None]:
        return (
            MessageDispatch[None]("tokenizer manager")
            .on(BatchStrOut, self._on_outputs)
            .on(BatchEmbeddingOut, self._on_embeddings)
            .on(FlushCacheOut, self._on_control_reply)
            .on(LoraAdapterOut, self._on_control_reply)
            .on(GetInternalStateOut, self._on_control_reply)
            .on(DashboardSnapshotOut, self._on_control_reply)
        )

    def _on_embeddings(self, msg: BatchEmbeddingOut) -> None:
        if self.embeddings is None:
            logger.error("unexpected message %s", type(msg).__name__)
            return
        for rid in self.embeddings.on_outputs(msg):
            if self.link is not None:
                self.link.on_finished(rid)

    def _on_control_reply(self, msg: ControlReply) -> None:
        if self.link is None or not self.link.on_control_reply(msg):
            logger.debug("dropped a %s nobody waits for", type(msg).__name__)

    def _on_outputs(self, out: BatchStrOut) -> None:
        now = time.perf_counter()
        link = self.link
        for d in out.deltas:
            rid = d.rid
            reason = d.finished_reason
            if reason is not None and link is not None:
                link.on_finished(rid)
            st = self.states.get(rid)
            if st is None:
                continue  # aborted and forgotten
            st.text += d.text
            new_ids = d.new_token_ids
            apply_delta(st.output_ids, d)
            st.meta = d.meta
            if new_ids and st.first_token_time is None:
                st.first_token_time = now
            if st.return_logprob:
                input_lp, output_lp = d.input_token_logprobs, d.output_token_logprobs
                if input_lp is not None:
                    st.input_token_logprobs = input_lp
                    st.input_top_logprobs = d.input_top_logprobs or []
                if output_lp:
                    st.output_token_logprobs.extend(output_lp)
                output_top = d.output_top_logprobs
                if output_top:
                    st.output_top_logprobs.extend(output_top)
            if reason is not None:
                st.finish_reason = reason
                st.finished_time = now
                if reason.is_abort and reason.status_code == 500:
                    # failed by a bug downstream (e.g. the detokenizer) while the scheduler may
                    # still run it: stop it there (an abort of a finished rid is ignored)
                    self._send_soon(AbortReq(rid=rid, message=reason.message))
            if self.metrics is not None and not st.internal:
                self.metrics.on_output(st, len(new_ids), now)
            st.event.set()

    def _send_soon(self, msg: AbortReq) -> None:
        """Send from sync code (the receive loop): the send completes on the event loop."""
        if self._ctx is not None and self.link is not None:
            self.link.send_abort(msg)  # a future; zmq.asyncio sends at once when it can

    async def _control(
        self, req: ControlRequest, reply_type: type[T], timeout: float = 30.0
    ) -> list[T]:
        """Send a control request to every scheduler replica; their replies in replica order."""
        self._check_alive()
        assert self.link is not None
        replies: list[T] = []
        for reply in await self.link.control(req, timeout):
            assert isinstance(reply, reply_type), f"{type(reply).__name__} answered {req!r}"
            replies.append(reply)
        return replies

    async def flush_cache(self, keep_lower_tiers: bool = False) -> FlushCacheOut:
        """Flush every replica's cache (with HiCache every tier, or the pool only with
        `keep_lower_tiers`); refused (with the first refusal's reason) if any refuses."""
        outs = await self._control(FlushCacheReq(keep_lower_tiers=keep_lower_tiers), FlushCacheOut)
        refused = [o for o in outs if not o.success]
        return refused[0] if refused else outs[0]

    async def load_lora_adapter(self, name: str, path: str) -> LoraAdapterOut:
        """Load an adapter while serving (SGLang's /load_lora_adapter); a refusal (bad folder,
        DoRA, rank over the max, ...) is an InvalidRequestError with the scheduler's reason."""
        if not self.lora_enabled:
            self.check_lora(name)  # the 400 saying LoRA is off
        if not name or not path:
            raise InvalidRequestError("give lora_name and lora_path", "lora_name")
        if name in self.lora_paths:
            raise InvalidRequestError(f"LoRA adapter {name!r} is already loaded", "lora_name")
        out = (
            await self._control(LoadLoraAdapterReq(lora_name=name, lora_path=path), LoraAdapterOut)
        )[0]
        if not out.success:
            raise InvalidRequestError(out.message, "lora_path")
        self.lora_paths[name] = path
        return out

    async def unload_lora_adapter(self, name: str) -> LoraAdapterOut:
        """Unload an adapter: new requests naming it are refused at once; those already sent
        finish first (the scheduler unloads it after the last)."""
        if not self.lora_enabled or name not in self.lora_paths:
            self.check_lora(name)  # the 400 naming what is loaded
        del self.lora_paths[name]
        out = (await self._control(UnloadLoraAdapterReq(lora_name=name), LoraAdapterOut))[0]
        if not out.success:
            raise InvalidRequestError(out.message, "lora_name")
        return out

    async def get_internal_states(self) -> list[InternalState]:
        """Each scheduler replica's `internal_state()`, in replica order."""
        return [
            out.state for out in await self._control(GetInternalStateReq(), GetInternalStateOut)
        ]

    async def get_internal_state(self) -> InternalState:
        """The engine's state: a single scheduler's, or the replicas' summed."""
        return summed_internal_state(await self.get_internal_states())

    async def dashboard_snapshot(self, max_nodes: int) -> DashboardSnapshot:
        """Replica 0's snapshot (with --dp-size > 1 its tree, steps and requests are that
        replica's; `dp_size` says how many there are)."""
        req = DashboardSnapshotReq(max_nodes=max_nodes)
        outs = await self._control(req, DashboardSnapshotOut, 10.0)
        return dataclasses.replace(outs[0].snapshot, dp_size=len(outs))

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """Abort one request (an n > 1 request's rid aborts all its samples) or all of them.

        NOTE: an abort may arrive before its request is submitted (while it is tokenized, or its
        n > 1 prompt is prefilled): such a rid is remembered and the request ends at submission.
        """
        if self._ctx is None:
            return
        assert self.link is not None
        if abort_all:
            await self.link.send_abort(AbortReq(abort_all=True))
            return
        for r in self.sample_rids.get(rid, [rid]):
            st = self.states.get(r)
            if st is None:
                self._remember_abort(r)
            elif not st.finished:
                await self.link.send_abort(AbortReq(rid=r))

    def _remember_abort(self, rid: str) -> None:
        now = time.monotonic()
        expired = [r for r, t in self._early_aborts.items() if now - t > EARLY_ABORT_TTL_S]
        for r in expired:
            del self._early_aborts[r]
        if len(self._early_aborts) >= EARLY_ABORT_MAX:
            del self._early_aborts[next(iter(self._early_aborts))]  # the oldest
        self._early_aborts[rid] = now

    def _aborted_early(self, rid: str) -> bool:
        t = self._early_aborts.pop(rid, None)
        return t is not None and time.monotonic() - t <= EARLY_ABORT_TTL_S

    def check_generates(self) -> None:
        """A generation request to an embedding server is a 400 that says what it serves."""
        if self.embeddings is not None:
            raise InvalidRequestError(
                f"this server serves the embedding model {self.served_model_name!r} "
                "(--is-embedding): it generates no text; use /v1/embeddings or /encode",
                None,
            )

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(f"the engine is not running: {self.dead_reason}")

    # --- validation and tokenization ----------------------------------------------------------

    async def encode_texts(
        self, texts: list[str], add_special_tokens: bool, param: str, truncate_to: int | None = None
    ) -> list[list[int]]:
        """Tokenize texts (limits checked first) in a worker thread, off the event loop;
        truncate_to: cut each to that many tokens (special tokens kept)."""
        for text in texts:
            self.limits.check_prompt_chars(len(text), param)
        if truncate_to is not None:
            return await asyncio.to_thread(
                self.tokenizer.encode_batch_truncated, texts, truncate_to
            )
        return await asyncio.to_thread(self.tokenizer.encode_batch, texts, add_special_tokens)

    async def warm_up(self) -> None:
        """One real step through every process before the server says it is healthy: a token
        generated, or on an embedding server one input embedded."""
        if self.embeddings is not None:  # a reranker too: one input through its forward
            await self.embeddings.embed(await self.encode_texts(["Hi"], True, "text"), None, "text")
            return
        async for _ in self.generate(
            GenerateReqInput(text="Hi", sampling_params={"max_new_tokens": 1})
        ):
            pass

    # --- embeddings ---------------------------------------------------------------------------

    async def embed(
        self, inputs: list[list[int]], dimensions: int | None, param: str = "input"
    ) -> list[EmbeddingResult]:
        """One vector per token list (an embedding server only; 400 on a generation server)."""
        self._check_alive()
        if self.embeddings is None:
            raise InvalidRequestError(
                "this server generates text: embeddings need a server started with --is-embedding",
                None,
            )
        if self.ready.cross_encoder:
            raise InvalidRequestError(
                f"{self.served_model_name!r} is a cross-encoder (reranker): it scores query and "
                "document pairs on /v1/rerank and makes no embeddings",
                None,
            )
        self.limits.check_sequences(len(inputs))
        self._check_capacity(len(inputs))
        return await self.embeddings.embed(inputs, dimensions, param)

    @property
    def max_embedding_tokens(self) -> int:
        """The longest input an embedding server takes (its model's limit)."""
        return self.ready.max_req_input_len

    async def rerank(
        self, query: str, documents: list[str], truncate: bool = False
    ) -> list[EmbeddingResult]:
        """Each document's relevance to the query (a cross-encoder's score), in order;
        truncate: cut each pair to the model's limit instead of refusing it (a yes/no
        reranker's: the document, so that its prompt fits)."""
        self._check_alive()
        if self.embeddings is None or not self.ready.cross_encoder:
            raise InvalidRequestError(
                "reranking needs a cross-encoder (e.g. BertForSequenceClassification), or a "
                "decoder with --reranker-tokens, served with --is-embedding; this server serves "
                f"{self.served_model_name!r}",
                None,
            )
        self.limits.check_sequences(len(documents))
        self._check_capacity(len(documents))
        self.limits.check_prompt_chars(len(query), "query")
        for doc in documents:
            self.limits.check_prompt_chars(len(doc), "documents")
        if self.args.model.reranker_tokens is not None:  # a yes/no decoder: one prompt a pair
            template = rerank_template(self.args.model.rerank_template)
            prompts = [rerank_prompt(template, query, doc) for doc in documents]
            ids = await asyncio.to_thread(self.tokenizer.encode_batch, prompts, False)
            if truncate:
                ids = await asyncio.to_thread(
                    self._cut_rerank_documents, template, query, documents, ids
                )
            return await self.embeddings.embed(ids, None, "documents")
        pairs = [(query, doc) for doc in documents]
        limit = self.max_embedding_tokens if truncate else None
        encoded = await asyncio.to_thread(self.tokenizer.encode_pairs, pairs, limit)
        ids = [e[0] for e in encoded]
        return await self.embeddings.embed(ids, None, "documents", [e[1] for e in encoded])

    def _cut_rerank_documents(
        self, template: str, query: str, documents: list[str], ids: list[list[int]]
    ) -> list[list[int]]:
        """A yes/no reranker's `truncate`: each prompt over the model's limit gets its document
        cut to the longest token prefix whose prompt fits (the instruction, the query and the
        answer turn stay whole, so the next token is still the answer); 400 naming the query
        when the prompt is over the limit with an empty document."""
        limit = self.max_embedding_tokens

        def prompt_ids(doc_ids: list[int]) -> list[int]:
            doc = self.tokenizer.decode(doc_ids, skip_special_tokens=False)
            return self.tokenizer.encode(rerank_prompt(template, query, doc), False)

        out = []
        for doc, full in zip(documents, ids, strict=True):
            if len(full) <= limit:
                out.append(full)
                continue
            empty = prompt_ids([])
            if len(empty) > limit:
                raise InvalidRequestError(
                    f"the rerank prompt without its document has {len(empty)} tokens; this "
                    f"model takes at most {limit}: shorten the query",
                    "query",
                )
            doc_ids = self.tokenizer.encode(doc, False)
            keep = max(0, len(doc_ids) - (len(full) - limit))
            cut = prompt_ids(doc_ids[:keep])
            while len(cut) > limit and keep > 0:  # a merge across the cut can add a token
                keep = max(0, keep - (len(cut) - limit))
                cut = prompt_ids(doc_ids[:keep])
            while keep < len(doc_ids):  # and one less can take back more than one
                longer = prompt_ids(doc_ids[: keep + 1])
                if len(longer) > limit:
                    break
                keep, cut = keep + 1, longer
            out.append(cut)
        return out

    async def _send_embedding(self, msg: TokenizedEmbeddingReq) -> int:
        assert self.link is not None
        return await self.link.send_request(msg)

    async def _send_abort(self, msg: AbortReq) -> None:
        if self._ctx is not None and self.link is not None:
            await self.link.send_abort(msg)

    # --- generation ---------------------------------------------------------------------------

    async def generate(
        self, obj: GenerateReqInput
    ) -> AsyncGenerator[GenerateOutput | list[GenerateOutput], None]:
        """Yield SGLang-shaped dicts: one final dict (or list for batches), or chunks when streaming."""
        self._check_alive()
        self.check_generates()
        obj.check_per_item_lengths()
        self.limits.check_sequences(obj.batch_size())  # before splitting a huge batch into items
        items = [obj.item(i) for i in range(obj.batch_size())] if obj.is_batch else [obj]
        # NOTE: everything is validated (params, lengths, rids, capacity) before anything is sent;
        # the cheap checks first, then tokenizing in a worker thread (the loop keeps serving)
        params = [self.checker.check_request(it) for it in items]
        for it in items:
            resolve_priority(it.priority, self.args.scheduler)  # a refused priority: 400 first
            self.check_lora(it.lora_path)
        self.limits.check_sequences(sum(sp.n for sp in params))
        ids_per_item = await asyncio.to_thread(
            lambda: [
                self.checker.tokenize_one(it, sp) for it, sp in zip(items, params, strict=True)
            ]
        )
        prepared = list(zip(items, ids_per_item, params, strict=True))
        expanded: list[tuple[GenerateReqInput, list[int], SamplingParams]] = []
        # ids, the replica asked for, the item (its priority)
        shared_prompts: list[tuple[list[int], int | None, GenerateReqInput]] = []
        groups: dict[str, list[str]] = {}  # a user's rid of an n > 1 request -> its samples
        for it, ids, sp in prepared:
            if sp.n > 1:
                shared_prompts.append((ids, it.data_parallel_rank, it))
                base = _one(it.rid) or uuid.uuid4().hex
                groups[base] = [f"{base}-{k}" for k in range(sp.n)]
                for k, sample_rid in enumerate(groups[base]):
                    child = dataclasses.replace(it, rid=sample_rid)
                    seed = None if sp.seed is None else sp.seed + k  # n distinct samples
                    expanded.append((child, ids, dataclasses.replace(sp, n=1, seed=seed)))
            else:
                expanded.append((it, ids, sp))
        self._check_rids([*groups, *(_one(it.rid) for it, _, _ in expanded)])
        self._check_capacity(len(expanded))
        self.sample_rids.update(groups)  # NOTE: before the prefill, so an abort finds the samples
        for base, samples in groups.items():
            if self._aborted_early(base):  # aborted by the user's rid before we knew its samples
                for sample_rid in samples:
                    self._remember_abort(sample_rid)
        states: list[ReqState] = []
        plural = obj.is_batch or len(expanded) > 1
        try:
            # NOTE: with data parallelism an n > 1 request's samples go where its prompt was cached
            prompt_rank = {
                id(ids): await self._cache_prompt(ids, r, it) for ids, r, it in shared_prompts
            }
            for it, ids, sp in expanded:
                rank = prompt_rank.get(id(ids))
                rank = it.data_parallel_rank if rank is None else rank
                states.append(await self._submit(it, ids, sp, rank=rank))
            if obj.stream:
                async for chunk in self._stream(states, plural):
                    yield chunk
            else:
                results = await asyncio.gather(*(self._wait_final(st) for st in states))
                if not plural:
                    self._raise_if_rejected(states[0])
                yield results if plural else results[0]
        except BaseException:  # cancelled, client gone, or a failed submit: stop what runs
            for st in states:
                if not st.finished:
                    await self.abort_request(st.rid)
            raise
        finally:
            # states[k] was submitted from expanded[k]; a failed submit leaves states shorter
            for (it, _, sp), st in zip(expanded, states, strict=False):
                self.states.pop(st.rid, None)
                self.program_traces.on_finish(st)
                self.request_log.finished(it, sp, st)
            for rid in groups:
                self.sample_rids.pop(rid, None)

    async def _cache_prompt(
        self, ids: list[int], rank: int | None, it: GenerateReqInput
    ) -> int | None:
        """n > 1: prefill the shared prompt once (at the request's own priority) so the n samples
        reuse its KV from the cache; returns the replica that holds it (None: no cache to fill)."""
        if self.args.cache.disable_radix_cache:
            return None
        # NOTE: under the request's adapter: the cache keeps each adapter's prefixes apart
        prefill = GenerateReqInput(
            priority=it.priority, background=it.background, lora_path=it.lora_path
        )
        st = await self._submit(
            prefill, ids, SamplingParams(max_new_tokens=0), internal=True, rank=rank
        )
        assert self.link is not None
        rank = self.link.replica_of(st.rid)
        try:
            await self._wait_final(st)
        finally:
            self.states.pop(st.rid, None)
        return rank

    def adapter_for_model(self, model: str | None, lora_path: str | None) -> str | None:
        """The adapter an OpenAI request runs under: its `lora_path`, else its `model` when that
        names a loaded adapter (vLLM's way) or is `<served name>:<adapter>` (SGLang's); any
        other model name runs the base model, as before."""
        if lora_path is not None or model is None or not self.lora_paths:
            return lora_path
        if model in self.lora_paths:
            return model
        base, sep, adapter = model.rpartition(":")
        if sep and base == self.served_model_name and adapter:
            return adapter  # checked like any lora_path: an unknown one is a 400
        return None

    def check_lora(self, name: object) -> None:
        """A request's adapter must be loaded (400 naming it otherwise, or LoRA being off)."""
        if name is None:
            return
        if not self.lora_enabled:
            raise InvalidRequestError(
                "LoRA adapters are not enabled on this server (start it with --enable-lora)",
                "lora_path",
            )
        if not isinstance(name, str) or name not in self.lora_paths:
            known = ", ".join(sorted(self.lora_paths)) or "none"
            raise InvalidRequestError(
                f"LoRA adapter {name!r} is not loaded (loaded: {known})", "lora_path"
            )

    def _check_rids(self, rids: list[str | None]) -> None:
        given = [r for r in rids if r]
        seen: set[str] = set()
        for rid in given:
            if rid in seen or rid in self.states or rid in self.sample_rids:
                raise InvalidRequestError(f"request id {rid!r} is already in use", "rid")
            seen.add(rid)

    def _check_capacity(self, n: int) -> None:
        cap = self.args.scheduler.max_queued_requests
        if cap is None:
            return
        in_flight = sum(1 for s in self.states.values() if not s.finished)
        in_flight += len(self.embeddings) if self.embeddings is not None else 0
        running = self.args.scheduler.max_running_requests * self.args.parallel.dp_size
        if in_flight + n > running + cap:
            raise QueueFullError(
                f"the server is busy: {in_flight} sequences in flight and this request adds {n}; "
                f"at most {running} run and {cap} wait (--max-queued-requests); retry later",
                QUEUE_RETRY_AFTER_S,
            )

    async def _submit(
        self,
        it: GenerateReqInput,
        ids: list[int],
        sp: SamplingParams,
        internal: bool = False,
        rank: int | None = None,
    ) -> ReqState:
        rid = _one(it.rid) or uuid.uuid4().hex
        if rid in self.states:
            raise InvalidRequestError(f"request id {rid!r} is already in use", "rid")
        start = _one(it.logprob_start_len)
        start = start if start is not None else -1
        if it.return_logprob and start == -1 and sp.max_new_tokens == 0:
            start = 0  # prefill-only scoring: report the whole prompt
        st = ReqState(
            rid=rid,
            prompt_tokens=len(ids),
            return_logprob=bool(it.return_logprob),
            top_logprobs_num=_one(it.top_logprobs_num) or 0,
            return_text=it.return_text_in_logprobs,
            created=time.perf_counter(),
            internal=internal,
            stream=bool(it.stream),
            constrained=sp.constraint is not None,
        )
        self.states[rid] = st
        st.trace = self.program_traces.on_submit(None if internal else it.program_trace, st)
        if self._aborted_early(rid):
            st.finish_reason = FinishReason.abort("aborted by the client", 499)
            st.finished_time = st.created
            return st
        msg = TokenizedGenerateReq(
            rid=rid,
            input_ids=ids,
            sampling_params=sp,
            return_logprob=bool(it.return_logprob),
            logprob_start_len=start,
            top_logprobs_num=_one(it.top_logprobs_num) or 0,
            stream=it.stream,
            arrival_time=time.time(),
            priority=resolve_priority(it.priority, self.args.scheduler),
            background=it.background,
            lora_path=it.lora_path if isinstance(it.lora_path, str) else None,
            pin_prefix=it.pin_prefix,
        )
        assert self.link is not None
        await self.link.send_request(msg, rank)
        if self.metrics is not None and not internal:
            self.metrics.on_submit(st)
        return st

    async def _wait_final(self, st: ReqState) -> GenerateOutput:
        while not st.finished:
            await st.event.wait()
            st.event.clear()
        return build_output(st, 0, self.tokenizer, self.args.cache.enable_hierarchical_cache)

    async def _stream(self, states: list[ReqState], plural: bool) -> AsyncIterator[GenerateOutput]:
        """One chunk per wake-up that added text (or finished the request), carrying the logprob
        entries of every token since the previous chunk.

        NOTE: a wake-up whose tokens added no text yet (a held-back stop-string prefix or a
        partial UTF-8 character) sends nothing: its tokens and logprobs go with the next chunk.
        SGLang's server never streams a chunk without text either, and its frontend relies on
        it: a textless chunk coalesced with the next one on the client loses its logprobs.
        """
        sent_lp = [0] * len(states)
        sent_text = [0] * len(states)
        pending = set(range(len(states)))
        waiters = {i: asyncio.ensure_future(states[i].event.wait()) for i in pending}
        try:
            while pending:
                done, _ = await asyncio.wait(
                    [waiters[i] for i in pending], return_when=asyncio.FIRST_COMPLETED
                )
                for i in sorted(pending):
                    if waiters[i] not in done:
                        continue
                    st = states[i]
                    st.event.clear()
                    # NOTE: judged before the yield: while the consumer holds the chunk, more
                    # output (the finish too) may arrive; it sets the event for the next round
                    final = st.finished
                    if final or len(st.text) > sent_text[i]:
                        chunk = build_output(
                            st,
                            sent_lp[i],
                            self.tokenizer,
                            self.args.cache.enable_hierarchical_cache,
                        )
                        sent_lp[i] = len(st.output_token_logprobs)
                        sent_text[i] = len(st.text)
                        if plural:
                            chunk["index"] = i
                        yield chunk
                    if final:
                        pending.discard(i)
                    else:
                        waiters[i] = asyncio.ensure_future(st.event.wait())
        finally:
            for w in waiters.values():
                w.cancel()

    def _raise_if_rejected(self, st: ReqState) -> None:
        fr = st.finish_reason
        if fr is None or not fr.is_abort:
            return
        if fr.status_code == 400:
            raise InvalidRequestError(fr.message or "request rejected", None)
        if fr.status_code == 503:
            raise EngineDeadError(fr.message or "engine unavailable")
        if fr.status_code == 500:
            raise InternalError(fr.message or "internal error")

    # --- info ---------------------------------------------------------------------------------

    def model_info(self) -> dict[str, object]:
        # NOTE: `model_path` is always loadable by Hugging Face tools (SGLang clients pass it to
        # `get_tokenizer`): the bundled default model reports its converted folder, not a name.
        return {
            "model_path": self.args.model.model_path or self.model_folder,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.args.model.tokenizer_path or self.model_folder,
            "is_generation": self.embeddings is None,
            "context_length": self.context_length,
            "max_total_num_tokens": self.max_total_tokens,
            "vocab_size": self.vocab_size,
            "dtype": self.ready.dtype,
            # as chosen at load (flags, CPU features, model file), not the flags given
            "quantization": self.ready.quantization,
            "kernel_isa": self.ready.kernel_isa,
            "kernel_act_quant": self.ready.kernel_act_quant,
            "kernel_wide_rows": self.ready.kernel_wide_rows,
        }
