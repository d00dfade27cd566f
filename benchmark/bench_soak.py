"""Soak test: a long mixed load against a real server, then checks that nothing leaked or hung.

64 clients (by default) loop for --duration seconds, each sending one request at a time drawn from
a mix: native /generate plain and streamed, n > 1, JSON-schema and regex constrained, few-shot
prompts sharing long prefixes, long prompts, OpenAI chat streams, requests aborted through
/abort_request a moment after they are sent, clients that disconnect mid-stream or time out, and a
few hostile requests (bad regex, absurd parameters, broken JSON, oversized prompts). A probe polls
/health throughout; the API, scheduler and detokenizer processes' memory is sampled.

It passes (exit 0) when:
- no request was lost or hung: every one got an answer (a finish reason), a clean refusal (a 4xx
  with an error body, or 429 when the queue is full) or was dropped by its own client on purpose;
  no 5xx, no connection error, no client timeout;
- afterwards the scheduler is idle with the radix cache unlocked (protected tokens 0, every used
  KV slot evictable) and a cache flush frees the whole KV pool;
- each process's memory grew less than 10 % from the end of the warm-up to the end.
It reports /health latency percentiles during the run and writes benchmark/RESULTS.md.

  python benchmark/bench_soak.py                  # 10 minutes, launches its own server
  python benchmark/bench_soak.py --duration 60    # a quick smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from benchmark_results import replace_section
from server_launch import launch_server

REQUEST_TIMEOUT_S = 300.0  # a request unanswered for this long is "hung"
MEMORY_GROWTH_LIMIT = 0.10

FEW_SHOT = [
    "You extract facts from short notes. Answer with one line.\n\n"
    + "".join(
        f"Note: {name} moved to {city} in {year} to work as a {job}.\n"
        f"Fact: {name} | {city} | {year} | {job}\n\n"
        for name, city, year, job in [
            ("Ana", "Lisbon", 2011, "nurse"),
            ("Bo", "Oslo", 2015, "baker"),
            ("Chen", "Taipei", 2019, "pilot"),
            ("Dara", "Dublin", 2008, "teacher"),
            ("Emil", "Vienna", 2021, "chemist"),
        ]
    ),
    "Q: What is 2 + 2?\nA: 4\n\nQ: What colour is the sky on a clear day?\nA: Blue\n\n"
    "Q: How many legs does a spider have?\nA: Eight\n\nQ: What is the capital of Japan?\nA: Tokyo\n\n",
]
NAMES = ["Fay", "Gil", "Hana", "Ivo", "Jun", "Kai", "Lea", "Mo", "Nia", "Oto"]
CITIES = ["Rome", "Lima", "Cairo", "Perth", "Quito", "Riga", "Seoul", "Tunis"]
QUESTIONS = ["What is 3 + 5?", "What is the capital of Italy?", "How many days are in a week?"]
WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "maple", "orbit", "signal"]
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}

# kind -> weight in the mix
MIX = {
    "plain": 14,
    "stream": 12,
    "few_shot": 14,
    "n2": 6,
    "json": 8,
    "regex": 6,
    "chat_stream": 10,
    "long_prompt": 3,
    "abort": 8,
    "disconnect": 7,
    "client_timeout": 4,
    "hostile": 8,
}


@dataclass
class Outcome:
    kind: str
    result: str  # answered | aborted | refused | dropped | FAILED:<why>
    status: int = 0
    latency: float = 0.0
    tokens: int = 0
    detail: str = ""


@dataclass
class Soak:
    url: str
    headers: dict[str, str]
    deadline: float
    rng: random.Random
    outcomes: list[Outcome] = field(default_factory=list)
    health_latencies: list[float] = field(default_factory=list)
    health_failures: int = 0
    retry_after_seen: int = 0


def _prompt(rng: random.Random) -> str:
    return f"Note: {rng.choice(NAMES)} moved to {rng.choice(CITIES)} in {rng.randint(1990, 2024)}.\nFact:"


def _long_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _hostile(rng: random.Random) -> tuple[str, Any, str]:
    """(path, body or raw bytes, what it is): each must be refused with a 4xx."""
    cases: list[tuple[str, Any, str]] = [
        ("/generate", {"text": "x", "sampling_params": {"regex": "(unclosed"}}, "bad regex"),
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -5}}, "negative max"),
        ("/generate", {"text": "x", "sampling_params": {"temperature": "hot"}}, "wrong type"),
        ("/generate", {"text": "x", "sampling_params": {"top_p": 7}}, "top_p out of range"),
        ("/generate", b'{"text": "x", "sampling_params": {', "broken JSON"),
        ("/generate", {"text": "", "sampling_params": {}}, "empty prompt"),
        ("/generate", {"text": _long_text(rng, 12000)}, "prompt over the context"),
        ("/generate", {"input_ids": [10**12]}, "token id out of range"),
        ("/v1/chat/completions", {"model": "default", "messages": "hi"}, "messages not a list"),
        ("/v1/completions", {"model": "default", "prompt": "x", "n": 10**9}, "absurd n"),
    ]
    return rng.choice(cases)


async def _post_json(
    soak: Soak, session: aiohttp.ClientSession, path: str, body: Any, timeout: float
) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**soak.headers, "Content-Type": "application/json"}
    async with session.post(
        soak.url + path, data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as resp:
        if resp.status == 429 and "Retry-After" in resp.headers:
            soak.retry_after_seen += 1
        raw = await resp.read()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw.decode(errors="replace")


def _classify(kind: str, status: int, body: Any, aborted_on_purpose: bool = False) -> Outcome:
    """One non-streamed answer: finish reasons of every item, or a clean refusal."""
    if status == 200 and body is not None:
        items = body if isinstance(body, list) else [body]
        reasons = []
        tokens = 0
        for item in items:
            meta = item.get("meta_info", {}) if isinstance(item, dict) else {}
            fr = meta.get("finish_reason") or {}
            reasons.append(fr.get("type"))
            tokens += meta.get("completion_tokens", 0)
            if fr.get("type") == "abort" and not aborted_on_purpose:
                return Outcome(kind, f"FAILED:unexpected abort {fr}", status, tokens=tokens)
        if None in reasons:
            return Outcome(kind, f"FAILED:no finish reason in {body!r:.200}", status)
        return Outcome(kind, "aborted" if "abort" in reasons else "answered", status, tokens=tokens)
    if 400 <= status < 500 and isinstance(body, dict) and body.get("error", {}).get("message"):
        return Outcome(kind, "refused", status, detail=body["error"]["message"][:120])
    return Outcome(kind, f"FAILED:HTTP {status} {body!r:.200}", status)


async def _stream(
    soak: Soak, session: aiohttp.ClientSession, path: str, body: dict[str, Any], stop_after: int
) -> Outcome:
    """A streamed request read to its end (or, with stop_after > 0, dropped after that many chunks)."""
    kind = body.pop("_kind")
    headers = {**soak.headers, "Content-Type": "application/json"}
    chunks = 0
    async with session.post(
        soak.url + path,
        data=json.dumps(body).encode(),
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
    ) as resp:
        if resp.status != 200:
            raw = await resp.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            if resp.status == 429 and "Retry-After" in resp.headers:
                soak.retry_after_seen += 1
            return _classify(kind, resp.status, parsed)
        finished = False
        async for raw_line in resp.content:
            line = raw_line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            data = json.loads(payload)
            if "error" in data:
                code = data["error"].get("code", 0)
                if 400 <= code < 500:
                    return Outcome(kind, "refused", code, detail=str(data["error"])[:120])
                return Outcome(kind, f"FAILED:stream error {data['error']}", code)
            chunks += 1
            if stop_after and chunks >= stop_after:
                return Outcome(kind, "dropped", 200)  # leaving the block closes the connection
            if "meta_info" in data and data["meta_info"].get("finish_reason"):
                finished = True
            for choice in data.get("choices") or []:
                if choice.get("finish_reason"):
                    finished = True
        if not finished:
            return Outcome(kind, "FAILED:stream ended without a finish reason", 200)
        return Outcome(kind, "answered", 200, tokens=chunks)


def _generate_body(kind: str, rng: random.Random, sp: dict[str, Any]) -> dict[str, Any] | None:
    """The /generate body of a non-streamed kind (None for the kinds that do more)."""
    if kind == "plain":
        return {"text": _prompt(rng), "sampling_params": sp}
    if kind == "few_shot":
        question = _prompt(rng) if rng.random() < 0.5 else f"Q: {rng.choice(QUESTIONS)}\nA:"
        return {"text": rng.choice(FEW_SHOT) + question, "sampling_params": sp}
    if kind == "n2":
        return {"text": _prompt(rng), "sampling_params": {**sp, "n": 2}}
    if kind == "json":
        sp.update(max_new_tokens=48, json_schema=json.dumps(PERSON_SCHEMA))
        return {"text": "A person as JSON: ", "sampling_params": sp}
    if kind == "regex":
        sp.update(regex=r"(yes|no|maybe)\.", max_new_tokens=8)
        return {"text": f"Q: {rng.choice(QUESTIONS)} Is it easy?\nA:", "sampling_params": sp}
    if kind == "long_prompt":
        return {"text": _long_text(rng, rng.randint(900, 1400)), "sampling_params": sp}
    return None


async def _one(soak: Soak, session: aiohttp.ClientSession, kind: str) -> Outcome:
    rng = soak.rng
    sp: dict[str, Any] = {"max_new_tokens": rng.randint(8, 40), "temperature": 0.7}
    body = _generate_body(kind, rng, sp)
    if body is not None:
        status, out = await _post_json(soak, session, "/generate", body, REQUEST_TIMEOUT_S)
        return _classify(kind, status, out)
    if kind == "stream":
        body = {"_kind": kind, "text": _prompt(rng), "sampling_params": sp, "stream": True}
        return await _stream(soak, session, "/generate", body, 0)
    if kind == "chat_stream":
        body = {
            "_kind": kind,
            "model": "default",
            "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}],
            "max_tokens": sp["max_new_tokens"],
            "stream": True,
        }
        return await _stream(soak, session, "/v1/chat/completions", body, 0)
    if kind == "disconnect":
        sp["max_new_tokens"] = 64
        body = {"_kind": kind, "text": _prompt(rng), "sampling_params": sp, "stream": True}
        return await _stream(soak, session, "/generate", body, rng.randint(1, 3))
    if kind == "client_timeout":
        sp["max_new_tokens"] = 64
        try:
            await _post_json(
                soak, session, "/generate", {"text": _prompt(rng), "sampling_params": sp},
                rng.uniform(0.2, 1.5),
            )  # fmt: skip
        except asyncio.TimeoutError:
            return Outcome(kind, "dropped")
        return Outcome(kind, "answered")  # finished before our patience ran out
    if kind == "abort":
        rid = uuid.uuid4().hex
        sp["max_new_tokens"] = 64
        body = {"text": _prompt(rng), "sampling_params": sp, "rid": rid}
        task = asyncio.ensure_future(
            _post_json(soak, session, "/generate", body, REQUEST_TIMEOUT_S)
        )
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        abort_status, _ = await _post_json(soak, session, "/abort_request", {"rid": rid}, 30)
        status, out = await task
        outcome = _classify(kind, status, out, aborted_on_purpose=True)
        if abort_status != 200:
            return Outcome(kind, f"FAILED:/abort_request answered {abort_status}", abort_status)
        return outcome
    if kind == "hostile":
        path, body, what = _hostile(rng)
        status, out = await _post_json(soak, session, path, body, REQUEST_TIMEOUT_S)
        outcome = _classify(f"hostile:{what}", status, out)
        if outcome.result != "refused":
            return Outcome(outcome.kind, f"FAILED:expected a 4xx, got {status}", status)
        return outcome
    raise ValueError(kind)


async def _client(soak: Soak, session: aiohttp.ClientSession) -> None:
    kinds, weights = list(MIX), list(MIX.values())
    while time.monotonic() < soak.deadline:
        kind = soak.rng.choices(kinds, weights)[0]
        start = time.monotonic()
        try:
            outcome = await _one(soak, session, kind)
        except asyncio.TimeoutError:
            outcome = Outcome(kind, f"FAILED:hung (no answer in {REQUEST_TIMEOUT_S:g} s)")
        except aiohttp.ClientError as e:
            outcome = Outcome(kind, f"FAILED:connection {type(e).__name__}: {e}")
        outcome.latency = time.monotonic() - start
        soak.outcomes.append(outcome)
        if outcome.status == 429:
            await asyncio.sleep(1.0)  # as Retry-After asks


async def _probe_health(soak: Soak, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                async with session.get(
                    soak.url + "/health", timeout=aiohttp.ClientTimeout(total=10)
                ) as resp:
                    await resp.read()
                    if resp.status != 200:
                        soak.health_failures += 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                soak.health_failures += 1
            soak.health_latencies.append(time.perf_counter() - start)
            await asyncio.sleep(0.25)


def _processes(server_pid: int) -> dict[str, psutil.Process]:
    server = psutil.Process(server_pid)
    procs = {"api": server}
    for child in server.children():
        cmd = " ".join(child.cmdline())
        for role in ("scheduler", "detokenizer"):
            if f"child_main {role}" in cmd:
                procs[role] = child
    return procs


def _rss_mb(procs: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: p.memory_info().rss / 2**20 for name, p in procs.items()}


async def _internal_state(url: str, headers: dict[str, str]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url + "/server_info", headers=headers) as resp,
    ):
        return (await resp.json())["internal_states"][0]


async def _prime_kv_pool(soak: Soak, session: aiohttp.ClientSession) -> dict[str, Any]:
    """Fill the KV pool once through the radix cache (unique prompts, one token each).

    The pool is allocated up front but the OS maps its pages on first write, so the scheduler's
    RSS climbs until every slot has been used once; that is not a leak, so it happens before
    the memory baseline.
    """
    rng = random.Random(soak.rng.random())
    st = await _internal_state(soak.url, soak.headers)
    for _ in range(400):
        if st["kv_used_tokens"] >= 0.9 * st["max_total_num_tokens"]:
            break
        bodies = [
            {"text": _long_text(rng, 900), "sampling_params": {"max_new_tokens": 1}}
            for _ in range(4)
        ]
        await asyncio.gather(
            *(_post_json(soak, session, "/generate", b, REQUEST_TIMEOUT_S) for b in bodies)
        )
        st = await _internal_state(soak.url, soak.headers)
    return st


async def _run(args: argparse.Namespace, url: str, server_pid: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    procs = _processes(server_pid)
    soak = Soak(url, headers, 0.0, random.Random(args.seed))
    rss_start = _rss_mb(procs)
    connector = aiohttp.TCPConnector(limit=args.concurrency * 2 + 8)
    async with aiohttp.ClientSession(connector=connector) as session:
        prime_start = time.monotonic()
        primed = await _prime_kv_pool(soak, session)
        print(
            f"  primed the KV pool: {primed['kv_used_tokens']}/{primed['max_total_num_tokens']} "
            f"tokens in {time.monotonic() - prime_start:.0f} s",
            file=sys.stderr,
        )
        start = time.monotonic()
        soak.deadline = start + args.duration
        stop_probe = asyncio.Event()
        probe = asyncio.ensure_future(_probe_health(soak, stop_probe))
        clients = [asyncio.ensure_future(_client(soak, session)) for _ in range(args.concurrency)]
        await asyncio.sleep(min(args.warmup, args.duration / 2))
        rss_warm = _rss_mb(procs)
        rss_peak = dict(rss_warm)
        trend: list[tuple[float, dict[str, float]]] = []  # a sample a minute: leak or plateau
        while not all(c.done() for c in clients):
            await asyncio.sleep(5)
            now_rss = _rss_mb(procs)
            for name, mb in now_rss.items():
                rss_peak[name] = max(rss_peak[name], mb)
            if not trend or time.monotonic() - start - trend[-1][0] >= 60:
                trend.append((time.monotonic() - start, now_rss))
            done = len(soak.outcomes)
            print(f"  {time.monotonic() - start:6.0f} s  {done} requests", file=sys.stderr)
        await asyncio.gather(*clients)
    stop_probe.set()
    await probe
    load_seconds = time.monotonic() - start

    # drain: the scheduler must come back to idle with the cache unlocked
    idle = None
    for _ in range(120):
        st = await _internal_state(url, headers)
        if st["running_requests"] == 0 and st["waiting_requests"] == 0:
            idle = st
            break
        await asyncio.sleep(0.5)
    rss_end = _rss_mb(procs)
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/flush_cache", headers=headers) as resp,
    ):
        flush_status = resp.status
    flushed = await _internal_state(url, headers)
    return {
        "soak": soak,
        "load_seconds": load_seconds,
        "idle": idle,
        "flushed": flushed,
        "flush_status": flush_status,
        "rss": {"start": rss_start, "warm": rss_warm, "peak": rss_peak, "end": rss_end},
        "primed": primed,
        "trend": trend,
    }


def _report(args: argparse.Namespace, run: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    soak: Soak = run["soak"]
    outcomes = soak.outcomes
    failed = [o for o in outcomes if o.result.startswith("FAILED")]
    by_result = Counter(o.result.split(":")[0] for o in outcomes)
    by_kind = Counter(o.kind.split(":")[0] for o in outcomes)
    idle, flushed = run["idle"], run["flushed"]
    checks: dict[str, bool] = {
        "no lost or hung request": not failed,
        "scheduler idle after the run": idle is not None,
        "radix cache unlocked (protected tokens 0)": bool(idle)
        and idle["cache_protected_tokens"] == 0,
        "every used KV slot evictable": bool(idle)
        and idle["kv_used_tokens"] == idle["cache_evictable_tokens"],
        "flush frees the whole KV pool": run["flush_status"] == 200
        and flushed["kv_used_tokens"] == 0,
        "/health never failed": soak.health_failures == 0,
    }
    rss = run["rss"]
    growth = {name: rss["end"][name] / rss["warm"][name] - 1 for name in rss["warm"]}
    for name, g in growth.items():
        checks[f"{name} memory growth < 10 %"] = g < MEMORY_GROWTH_LIMIT
    lat = sorted(soak.health_latencies)
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [lat[0]] * 99
    health = {
        "probes": len(lat),
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "max_ms": lat[-1] * 1000,
    }
    answered = [o for o in outcomes if o.result == "answered"]
    summary = {
        "duration_s": round(run["load_seconds"], 1),
        "concurrency": args.concurrency,
        "requests": len(outcomes),
        "results": dict(by_result),
        "kinds": dict(by_kind),
        "tokens_out": sum(o.tokens for o in answered),
        "retry_after_429s": soak.retry_after_seen,
        "health": {k: round(v, 1) if isinstance(v, float) else v for k, v in health.items()},
        "rss_mb": {k: {n: round(v) for n, v in d.items()} for k, d in rss.items()},
        "memory_growth_pct": {n: round(100 * g, 1) for n, g in growth.items()},
        "rss_trend": [(round(t), {n: round(v) for n, v in r.items()}) for t, r in run["trend"]],
        "checks": checks,
        "failures": [f"{o.kind}: {o.result} {o.detail}" for o in failed[:20]],
    }
    ok = all(checks.values())
    lines = [
        f"`python benchmark/bench_soak.py --duration {args.duration:g} --concurrency "
        f"{args.concurrency}` against `radixgen serve` (default model, {args.server_args or 'default flags'}),"
        f" run {time.strftime('%Y-%m-%d')}: **{'PASS' if ok else 'FAIL'}**.",
        "",
        f"- {len(outcomes)} requests in {run['load_seconds']:.0f} s: "
        + ", ".join(f"{n} {r}" for r, n in sorted(by_result.items()))
        + f"; {soak.retry_after_seen} refusals were 429 with Retry-After.",
        "- mix: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())),
        f"- `/health` during the run: {health['probes']} probes, p50 {health['p50_ms']:.1f} ms, "
        f"p99 {health['p99_ms']:.1f} ms, max {health['max_ms']:.0f} ms, {soak.health_failures} failed.",
        f"- before the load the KV pool was primed to {run['primed']['kv_used_tokens']} of "
        f"{run['primed']['max_total_num_tokens']} tokens (its pages are mapped on first write).",
        "- memory (RSS MiB) at start / after priming and warm-up / peak / end: "
        + "; ".join(
            f"{n} {rss['start'][n]:.0f} / {rss['warm'][n]:.0f} / {rss['peak'][n]:.0f} / "
            f"{rss['end'][n]:.0f} ({100 * growth[n]:+.1f} % since warm-up)"
            for n in rss["warm"]
        ),
        "- RSS a minute apart (API / scheduler MiB): "
        + ", ".join(f"{t:.0f} s {r['api']:.0f}/{r['scheduler']:.0f}" for t, r in run["trend"]),
        "- after the run: "
        + (
            f"idle; KV used {idle['kv_used_tokens']} = evictable {idle['cache_evictable_tokens']}, "
            f"protected {idle['cache_protected_tokens']}; after /flush_cache KV used "
            f"{flushed['kv_used_tokens']}."
            if idle
            else "the scheduler did NOT become idle within 60 s."
        ),
        "",
        "| check | |",
        "|---|---|",
        *(f"| {name} | {'ok' if passed else 'FAILED'} |" for name, passed in checks.items()),
    ]
    if failed:
        lines += ["", "Failures (first 20):", *(f"- {s}" for s in summary["failures"])]
    return ok, "\n".join(lines), summary


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the memory baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base-url", help="an already running server (default: launch one)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--server-pid", type=int, help="with --base-url: its pid, for memory figures")
    p.add_argument(
        "--server-args",
        default="--max-total-tokens 16384",
        help="flags for the launched server (default: a 16k-token KV pool, so the load keeps the"
        " radix cache evicting and requests retracting, and priming it takes seconds)",
    )
    p.add_argument("--no-results", action="store_true", help="do not write benchmark/RESULTS.md")
    args = p.parse_args()
    proc = None
    if args.base_url:
        if args.server_pid is None:
            p.error("--base-url needs --server-pid (memory is read from the processes)")
        url, pid = args.base_url, args.server_pid
    else:
        proc, url = launch_server(args.server_args.split())
        pid = proc.pid
    try:
        run = asyncio.run(_run(args, url, pid))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    ok, text, summary = _report(args, run)
    print(json.dumps(summary))
    if not args.no_results:
        replace_section(Path(__file__).with_name("RESULTS.md"), "Soak (bench_soak.py)", text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
