"""The router's workers: what each serves (from its own routes), whether it is up, and which one
takes a request. Pure selection logic plus the discovery requests; run by the router process.

A worker's models come from its `/v1/models` (the served name, then any LoRA adapters) and its
kind from SGLang's `/model_info` (`is_generation`); a worker without `/model_info` (another
OpenAI-compatible server) is taken to serve every route. Among the workers of one model the
data-parallel policies of `load_balance.py` choose, over the prompt's UTF-8 bytes instead of
token ids (the router does not tokenize: SGLang's router keeps its prefix trees over characters
for the same reason).
"""

from __future__ import annotations

import asyncio
import enum
import json
from dataclasses import dataclass, field

import aiohttp
import orjson

from radixgen.errors import InvalidRequestError
from radixgen.json_types import JSONValue
from radixgen.runtime.entrypoints.http_utils import NotFoundError, ServiceBusyError
from radixgen.runtime.request_side.load_balance import LoadBalancer

# the prompt bytes the cache-aware policy looks at: enough for any shared system prompt,
# few-shot block or document head to decide the route, bounded so routing stays cheap
ROUTING_KEY_BYTES = 4096


class RouteKind(enum.Enum):
    """What a route asks a worker to do; a worker serves generation or embedding-type routes."""

    GENERATION = "generation"
    EMBEDDING = "embedding"  # /v1/embeddings, /encode and /v1/rerank: an --is-embedding server


class ModelNotFoundError(NotFoundError):
    """No worker behind the router serves the named model (or any model for the route)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.param = "model"


class NoWorkerError(ServiceBusyError):
    """Workers serve the model, but none of them is up now."""


@dataclass(eq=False)
class Worker:
    """One server behind the router, as last seen by discovery."""

    url: str
    model_ids: tuple[str, ...] = ()  # the served model first, then its LoRA adapters
    cards: list[JSONValue] = field(default_factory=list)  # its /v1/models entries, as given
    is_generation: bool | None = None  # None: the worker has no /model_info (serves every route)
    healthy: bool = False
    error: str = "not checked yet"
    failed_checks: int = 0  # discovery failures in a row
    load: int = 0  # requests in flight through this router
    dispatched: int = 0  # requests sent since the router started

    @property
    def model_id(self) -> str:
        return self.model_ids[0] if self.model_ids else ""

    def serves(self, kind: RouteKind) -> bool:
        if self.is_generation is None:
            return True
        return self.is_generation == (kind is RouteKind.GENERATION)

    def kind_name(self) -> str:
        if self.is_generation is None:
            return "any"
        return "generation" if self.is_generation else "embedding"

    def as_dict(self) -> dict[str, JSONValue]:
        """The `/workers` entry (SGLang's router's keys where it has them)."""
        return {
            "url": self.url,
            "model_id": self.model_id,
            "models": list(self.model_ids),
            "kind": self.kind_name(),
            "is_healthy": self.healthy,
            "error": None if self.healthy else self.error,
            "load": self.load,
            "dispatched": self.dispatched,
        }


def _served_list(workers: list[Worker]) -> str:
    names = sorted({f"'{w.model_id}' ({w.kind_name()})" for w in workers if w.model_ids})
    return ", ".join(names) or "none"


class WorkerRegistry:
    """The workers and the choice among them (see the module docstring)."""

    def __init__(self, urls: list[str], policy: str) -> None:
        if not urls:
            raise InvalidRequestError("the router needs at least one worker URL", "worker_urls")
        self.workers = [Worker(url.rstrip("/")) for url in dict.fromkeys(urls)]
        self.policy = policy
        LoadBalancer(policy, 1)  # refuses an unknown policy now, not at the first request
        # one balancer per set of candidate workers (a model's workers that are up)
        self._balancers: dict[tuple[str, ...], LoadBalancer] = {}

    def candidates(self, kind: RouteKind, model: str | None, route: str) -> list[Worker]:
        """The workers that may take a request for `route` naming `model` (None: not named).

        A named model must be served by a worker of the route's kind; a name no worker knows
        falls back to the route's only model, as a single server ignores the name. Raises a
        404 (nothing serves it), a 400 (the model serves the other kind of route, or several
        models serve the route and none is named) or a 503 (its workers are down).
        """
        able = [w for w in self.workers if w.serves(kind)]
        if model is not None:
            named = [w for w in able if model in w.model_ids]
            if named:
                up = [w for w in named if w.healthy]
                if not up:
                    raise NoWorkerError(f"no worker serving model '{model}' is up now")
                return up
            other = [w for w in self.workers if model in w.model_ids]
            if other:
                raise InvalidRequestError(
                    f"model '{model}' is served for {other[0].kind_name()} routes, not {route}",
                    "model",
                )
            if any(not w.model_ids for w in able):  # e.g. still loading: it may serve `model`
                raise NoWorkerError(
                    f"model '{model}' is not served by the workers that answered; "
                    f"{sum(not w.model_ids for w in able)} worker(s) have not answered yet"
                )
        # the route's models: every worker that ever answered, up now or not
        known = {w.model_id for w in able if w.model_ids}
        if len(known) == 1:
            up = [w for w in able if w.healthy]
            if not up:
                raise NoWorkerError(f"no worker serving {route} is up now")
            return up
        if not known:
            if able:
                raise NoWorkerError(f"no worker serving {route} has answered yet")
            raise ModelNotFoundError(
                f"no worker behind this router serves {route}; it serves {_served_list(self.workers)}"
            )
        if model is None:
            raise InvalidRequestError(
                f"several models serve {route} here ({_served_list(able)}): name one in 'model'",
                "model",
            )
        raise ModelNotFoundError(
            f"model '{model}' does not exist here; this router serves {_served_list(self.workers)}"
        )

    def choose(self, candidates: list[Worker], key: bytes) -> Worker:
        """One of `candidates` by the policy; counts it as dispatched and in flight."""
        group = tuple(w.url for w in candidates)
        balancer = self._balancers.get(group)
        if balancer is None:
            balancer = self._balancers[group] = LoadBalancer(self.policy, len(candidates))
        rank = balancer.choose(list(key), [w.load for w in candidates])
        worker = candidates[rank]
        worker.load += 1
        worker.dispatched += 1
        return worker

    def mark_down(self, worker: Worker, error: str) -> None:
        worker.healthy = False
        worker.error = error

    def model_cards(self) -> list[JSONValue]:
        """The `/v1/models` entries of every worker that is up, each model once."""
        seen: set[str] = set()
        cards: list[JSONValue] = []
        for w in self.workers:
            if not w.healthy:
                continue
            for card in w.cards:
                name = card.get("id") if isinstance(card, dict) else None
                if isinstance(name, str) and name not in seen:
                    seen.add(name)
                    cards.append(card)
        return cards

    async def refresh(self, session: aiohttp.ClientSession, headers: dict[str, str]) -> None:
        """Ask every worker what it serves; a worker that does not answer is marked down."""
        await asyncio.gather(*(refresh_worker(session, w, headers) for w in self.workers))


DISCOVERY_TIMEOUT = aiohttp.ClientTimeout(total=10.0)
FAILED_CHECKS_DOWN = 2  # discovery failures in a row that mark a worker down


async def _get_json(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, JSONValue]:
    async with session.get(url, headers=headers, timeout=DISCOVERY_TIMEOUT) as r:
        body = await r.read()
        return r.status, (orjson.loads(body) if r.status == 200 else body.decode(errors="replace"))


async def refresh_worker(
    session: aiohttp.ClientSession, worker: Worker, headers: dict[str, str]
) -> None:
    """Read `worker`'s models (`/v1/models`, which a loading server refuses) and kind."""
    try:
        status, models = await _get_json(session, worker.url + "/v1/models", headers)
        if status != 200 or not isinstance(models, dict):
            raise ValueError(f"/v1/models answered {status}: {str(models)[:200]}")
        cards = models["data"]
        if not isinstance(cards, list):
            raise ValueError("/v1/models has no list of models")
        ids = tuple(
            name for c in cards if isinstance(c, dict) and isinstance(name := c.get("id"), str)
        )
        status, info = await _get_json(session, worker.url + "/model_info", headers)
        is_generation = None
        if status == 200 and isinstance(info, dict) and isinstance(info.get("is_generation"), bool):
            is_generation = bool(info["is_generation"])
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as e:
        worker.failed_checks += 1
        worker.error = f"{type(e).__name__}: {e}"
        # one slow answer on a loaded machine is not a dead worker; a refused connection while
        # forwarding marks it down at once (`WorkerRegistry.mark_down`)
        if worker.failed_checks >= FAILED_CHECKS_DOWN or not worker.model_ids:
            worker.healthy = False
        return
    worker.model_ids, worker.cards, worker.is_generation = ids, cards, is_generation
    worker.healthy, worker.error, worker.failed_checks = True, "", 0


def routing_key(body: dict[str, JSONValue]) -> bytes:
    """The start of the request's prompt, as bytes, for the cache-aware policy: the parts a
    later request with the same prefix repeats first (instructions, messages in order, the
    prompt or input, a rerank query before its documents)."""
    parts: list[str] = []
    for name in ("instructions", "messages", "input", "prompt", "text", "input_ids", "query"):
        value = body.get(name)
        if value is None:
            continue
        parts.append(value if isinstance(value, str) else _compact(value))
    if "documents" in body:
        parts.append(_compact(body["documents"]))
    return "\n".join(parts).encode()[:ROUTING_KEY_BYTES]


def _compact(value: JSONValue) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
