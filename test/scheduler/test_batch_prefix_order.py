"""Cache-aware order of batch lines: the ordering function, and its effect on the radix cache's
hit rate when shuffled lines run through a Scheduler (toy runner) with a bounded number in
flight, as the batch runner runs them."""

from __future__ import annotations

import random

from toy_runner import make_scheduler, submit

from radixgen.runtime.batch.ordering import cache_aware_order, prompt_start


def _chat(system: str, doc: str) -> dict:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": doc}]}


def test_lines_sharing_a_prompt_start_are_grouped_in_first_seen_order():
    a, b = "A" * 2000, "B" * 2000
    lines = [("1", _chat(a, "x")), ("2", _chat(b, "y")), ("3", _chat(a, "z")),
             ("4", _chat(b, "w")), ("5", _chat(a, "v"))]  # fmt: skip
    order = [cid for cid, _ in cache_aware_order(lines, lambda ln: ln[1])]
    assert order == ["1", "3", "5", "2", "4"]  # A's group where its first line was; input order


def test_finer_prefixes_split_a_coarse_group():
    head = "H" * 600  # shared by all: one group at the coarse lengths
    lines = [_chat(head + "P" * 2000, "1"), _chat(head + "Q" * 2000, "2"),
             _chat(head + "P" * 2000, "3"), {"prompt": "other"}]  # fmt: skip
    order = cache_aware_order(lines, lambda b: b)
    assert order == [lines[0], lines[2], lines[1], lines[3]]


def test_prompt_start_covers_tools_and_every_endpoint_body():
    assert prompt_start({"prompt": "abc"}) == '"abc"'
    assert prompt_start({"instructions": "sys", "input": "hi"}).startswith('"sys"')
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert prompt_start({"tools": tools, "messages": []}).startswith("[{")
    assert len(prompt_start({"prompt": "x" * 10_000})) == 8192


def _tokens(text: str) -> list[int]:
    return [ord(c) - 96 for c in text]  # 'a'..'z' -> 1..26, inside the toy vocab


def _cached_tokens(lines: list[dict], in_flight: int) -> tuple[int, int]:
    """Run the lines' prompts in this order, at most `in_flight` at a time; (cached, prompt)."""
    s, _ = make_scheduler(pool_tokens=320, debug_invariants=False)
    pending = list(lines)
    live: set[str] = set()
    n = 0
    while pending or s.has_work:
        while pending and len(live) < in_flight:
            rid = f"l{n}"
            n += 1
            submit(s, rid, _tokens(pending.pop(0)["prompt"]), max_new_tokens=2)
            live.add(rid)
        for out in s.step():
            for d in out.deltas:
                if d.finished_reason is not None:
                    live.discard(d.rid)
    return s.stats.cached_tokens, s.stats.prompt_tokens


def test_grouped_order_gets_the_hit_rate_of_the_sorted_order():
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    prefixes = ["".join(rng.choice(letters) for _ in range(60)) for _ in range(8)]
    lines = [{"prompt": p + "".join(rng.choice(letters) for _ in range(8))}
             for p in prefixes for _ in range(6)]  # fmt: skip
    sorted_hits, total = _cached_tokens(lines, in_flight=4)
    shuffled = list(lines)
    rng.shuffle(shuffled)
    shuffled_hits, _ = _cached_tokens(shuffled, in_flight=4)
    grouped_hits, _ = _cached_tokens(cache_aware_order(shuffled, lambda b: b), in_flight=4)
    # the pool holds ~4 prefixes' KV: shuffled, 8 prefixes keep evicting each other
    assert shuffled_hits < 0.8 * sorted_hits
    assert grouped_hits >= sorted_hits * 0.95, (grouped_hits, sorted_hits, shuffled_hits, total)
