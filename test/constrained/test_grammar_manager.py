"""GrammarManager: async compile + cache, poll failures, timeouts, batch masks, accept errors, stats."""

from __future__ import annotations

import time

import psutil
import pytest
import torch
from grammar_helpers import NO_LIMITS, VOCAB_SIZE, make_req, nested_array_schema

from radixgen.finish_reason import FinishReason
from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarObject
from radixgen.runtime.constrained.grammar_manager import GrammarManager
from radixgen.server_args import GrammarConfig

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


def new_manager(tokenizer, **config) -> GrammarManager:
    return GrammarManager(GrammarConfig(**config), tokenizer, VOCAB_SIZE, [2])


@pytest.fixture(scope="module")
def manager(tokenizer) -> GrammarManager:
    gm = new_manager(tokenizer)
    yield gm
    gm.shutdown()


def settle(gm: GrammarManager, reqs, timeout: float = 30.0):
    """Poll like the scheduler does until every request is ready or failed."""
    waiting, ready, failed = list(reqs), [], []
    deadline = time.monotonic() + timeout
    while waiting:
        assert time.monotonic() < deadline, "poll never settled"
        r, f = gm.poll(waiting)
        ready += r
        failed += f
        done = {id(x) for x in r + f}
        waiting = [x for x in waiting if id(x) not in done]
        time.sleep(0.002)
    return ready, failed


def submit_all(gm, reqs):
    for r in reqs:
        gm.submit(r)
    return reqs


def test_bad_specs_fail_alone_with_clear_messages(manager):
    reqs = submit_all(
        manager,
        [
            make_req("ok", json_schema=SCHEMA),
            make_req("bad_json", json_schema="{not json"),
            make_req("bad_type", json_schema={"type": "wat"}),
            make_req("bad_regex", regex="[a-"),
            make_req("bad_ebnf", ebnf="root ::= missing"),
            make_req("ok_regex", regex="[a-z]+"),
        ],
    )
    ready, failed = settle(manager, reqs)
    assert {r.rid for r in ready} == {"ok", "ok_regex"}
    assert all(r.grammar is not None and not r.finished for r in ready)
    reasons = {r.rid: r.finished_reason for r in failed}
    assert all(fr.kind == "abort" and fr.status_code == 400 for fr in reasons.values())
    assert reasons["bad_json"].message.startswith("invalid json_schema: not valid JSON")
    assert 'invalid json_schema: Unsupported type "wat"' in reasons["bad_type"].message
    assert reasons["bad_regex"].message.startswith("invalid regex:")
    assert 'Rule "missing" is not defined' in reasons["bad_ebnf"].message
    assert all(r.grammar is None for r in failed)


def test_compile_cache_shares_successes_only(tokenizer):
    gm = new_manager(tokenizer)
    try:
        first = submit_all(gm, [make_req(f"a{i}", json_schema=SCHEMA) for i in range(3)])
        settle(gm, first)
        later = submit_all(gm, [make_req("b", json_schema=SCHEMA)])
        ready, _ = settle(gm, later)
        assert ready and ready[0].grammar is not first[0].grammar  # a fresh matcher each
        for _ in range(2):
            settle(gm, submit_all(gm, [make_req("bad", regex="(")]))
        st = gm.stats()
        assert st.grammar_compiles == 3  # the schema once, the bad regex every time
        assert st.grammar_cache_hits == 3
        assert st.grammar_compile_errors == 2
        assert st.grammar_cache_entries == 1
    finally:
        gm.shutdown()


def test_unsupported_kind_is_refused(tokenizer):
    gm = new_manager(tokenizer, grammar_backend="outlines")
    try:
        _, failed = settle(gm, submit_all(gm, [make_req("e", ebnf='root ::= "a"')]))
        reason = failed[0].finished_reason
        assert reason.status_code == 400
        assert "outlines grammar backend does not support ebnf" in reason.message
        assert gm.stats().grammar_compiles == 0
    finally:
        gm.shutdown()


def test_compile_timeout_kills_the_worker_and_a_replacement_serves_the_next(tokenizer):
    # a real slow compile (arrays 300 deep: seconds in xgrammar), allowed past the depth limit
    gm = new_manager(tokenizer, grammar_compile_timeout=0.5, grammar_max_depth=10_000)
    try:
        settle(gm, submit_all(gm, [make_req("warm", regex="[0-9]+")]))
        deadline = time.monotonic() + 60  # every slot starts its worker: wait for all of them
        while len(gm.pool.worker_pids()) < gm.pool.workers:
            assert time.monotonic() < deadline, "compile workers never all started"
            time.sleep(0.05)
        before = set(gm.pool.worker_pids())
        slow = make_req("slow", limits=NO_LIMITS, json_schema=nested_array_schema(300))
        _, failed = settle(gm, submit_all(gm, [slow]))
        reason = failed[0].finished_reason
        assert "took longer than 0.5 s (grammar_compile_timeout)" in reason.message
        assert reason.status_code == 400
        st = gm.stats()
        assert st.grammar_compile_timeouts == 1 and st.grammar_compile_worker_kills == 1
        killed = before - set(gm.pool.worker_pids())
        assert len(killed) == 1 and not any(_alive(pid) for pid in killed)
        # the next compile is served (on the survivor or a fresh worker), and is cached
        ready, _ = settle(gm, submit_all(gm, [make_req("again", regex="[a-z]+")]))
        assert ready and gm.stats().grammar_cache_entries == 2
    finally:
        gm.shutdown()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_aborted_waiting_requests_are_forgotten(manager):
    gone = submit_all(manager, [make_req("gone", json_schema=SCHEMA)])
    stays = submit_all(manager, [make_req("stays", regex="x+")])
    settle(manager, stays)  # the scheduler no longer lists "gone"
    assert manager.stats().grammar_waiting_compiles == 0
    assert gone[0].grammar is None


def test_fill_mask_rows_match_single_fills(manager, encode):
    reqs = submit_all(manager, [make_req("a", json_schema=SCHEMA), make_req("b", regex="[0-9]{3}")])
    settle(manager, reqs)
    plain = make_req("plain")
    reqs[0].grammar.accept_tokens(encode('{"x":'))
    batch = [reqs[0], plain, reqs[1]]
    bitmask, rows = manager.fill_mask(batch)
    assert rows.tolist() == [0, 2] and bitmask.shape == (2, VOCAB_SIZE // 32)
    for j, r in enumerate((reqs[0], reqs[1])):
        single = torch.zeros(1, VOCAB_SIZE // 32, dtype=torch.int32)
        r.grammar.fill_next_token_bitmask(single, 0)
        assert torch.equal(bitmask[j], single[0])
    logits = torch.zeros(3, VOCAB_SIZE)
    from radixgen.kernels.sampling import apply_token_bitmask

    apply_token_bitmask(logits, bitmask, rows)
    assert torch.isfinite(logits[1]).all()
    assert int(torch.isfinite(logits[2]).sum()) < 100  # digits only


class _AllowAll(BaseGrammarObject):
    def accept_token(self, token_id):
        return True

    def fill_next_token_bitmask(self, bitmask, row):
        bitmask[row].fill_(-1)
        return False

    def find_jump_forward_string(self):
        return ""

    def rollback(self, num_tokens):
        pass

    def is_terminated(self):
        return False

    def copy(self):
        return self


def test_fill_mask_skips_rows_that_allow_everything(manager):
    free, tight = make_req("free"), submit_all(manager, [make_req("tight", regex="a")])[0]
    settle(manager, [tight])
    free.grammar = _AllowAll()
    bitmask, rows = manager.fill_mask([free, tight])
    assert rows.tolist() == [1] and bitmask.shape[0] == 1


def test_rejected_token_aborts_only_that_request(manager, encode):
    req = submit_all(manager, [make_req("r", regex="[0-9]+")])[0]
    settle(manager, [req])
    manager.accept(req, encode("7")[0])
    assert not req.finished
    before = manager.stats().grammar_rejected_tokens
    manager.accept(req, encode("x")[0])
    assert req.finished_reason == FinishReason.abort(
        f"internal error: the grammar rejected sampled token {encode('x')[0]}", 500
    )
    assert manager.stats().grammar_rejected_tokens == before + 1


def test_choices_and_json_object_compile(manager, encode):
    reqs = submit_all(
        manager, [make_req("c", choices=["alpha", "beta"]), make_req("o", json_object=True)]
    )
    ready, failed = settle(manager, reqs)
    assert not failed
    c, o = ready if ready[0].rid == "c" else ready[::-1]
    assert c.grammar.accept_tokens(encode("beta")) == len(encode("beta"))
    assert not o.grammar.accept_token(encode("[")[0])  # an object, not any JSON value
    assert o.grammar.accept_tokens(encode('{"k":[1]}')) == len(encode('{"k":[1]}'))


def test_stats_report_counters(manager):
    st = manager.stats()
    for key in (
        "grammar_compiles",
        "grammar_compile_seconds_total",
        "grammar_cache_hits",
        "mask_fill_seconds_total",
        "mask_fill_rows",
        "jump_forward_tokens",
    ):
        assert isinstance(getattr(st, key), (int, float))
        assert st.as_dict()[key] == getattr(st, key)


def test_a_request_aborted_while_waiting_leaves_no_pending_compile(tokenizer):
    """Its compile entry holds the request (so a new request cannot inherit the entry through a
    reused id()) and is dropped at the next poll that no longer lists it."""
    import gc
    import weakref

    gm = new_manager(tokenizer)
    try:
        gone = make_req("gone", regex="(a|b)")
        stays = make_req("stays", regex="(yes|no)")
        submit_all(gm, [gone, stays])
        ref = weakref.ref(gone)
        del gone
        gc.collect()
        assert ref() is not None  # still held by its pending entry: its id() is not reused
        assert gm.stats().grammar_waiting_compiles == 2
        ready, failed = settle(gm, [stays])  # the scheduler polls only what still waits
        assert [r.rid for r in ready] == ["stays"] and not failed
        assert gm.stats().grammar_waiting_compiles == 0
        gc.collect()
        assert ref() is None
    finally:
        gm.shutdown()


PATTERN_LEN = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}},
    "required": ["s"],
    "additionalProperties": False,
}


def test_mixed_backend_batch_fills_each_row_from_its_own_matcher(manager, encode):
    """xgrammar and llguidance rows interleaved in one step: each row equals its matcher's own
    mask, every constrained request gets exactly one row, and the two backends' caches are
    separate."""
    reqs = submit_all(
        manager,
        [
            make_req("x0", json_schema=SCHEMA),
            make_req("l0", json_schema=PATTERN_LEN),
            make_req("x1", json_schema=SCHEMA),
            make_req("l1", json_schema=PATTERN_LEN),
        ],
    )
    plain = make_req("plain", max_new_tokens=1)
    ready, failed = settle(manager, reqs)
    assert not failed and len(ready) == 4
    assert [r.grammar_backend for r in reqs] == ["xgrammar", "llguidance"] * 2
    assert manager.stats().grammar_backend_fallbacks >= 2
    for r, prefix in zip(reqs, ['{"x":', '{"s":"a', '{"x":1', '{"s":"ab'], strict=True):
        assert r.grammar.accept_tokens(encode(prefix)) == len(encode(prefix))
    batch = [reqs[0], reqs[1], plain, reqs[2], reqs[3]]
    bitmask, rows = manager.fill_mask(batch)
    assert sorted(rows.tolist()) == [0, 1, 3, 4]  # grouped by backend: rows name their request
    for j, i in enumerate(rows.tolist()):
        own = torch.zeros_like(bitmask[:1])
        batch[i].grammar.fill_next_token_bitmask(own, 0)
        assert torch.equal(bitmask[j], own[0]), batch[i].rid
    # the llguidance row after "ab" allows one more letter at most: pattern + maxLength enforced
    assert reqs[3].grammar.accept_tokens(encode("c")) == 1
    assert reqs[3].grammar.accept_tokens(encode("d")) == 0


def test_schema_no_backend_enforces_fails_alone_naming_it(manager):
    # a gap of each backend (xgrammar: a required name not declared; llguidance:
    # propertyNames), and no keyword the checked layer validates
    both = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a", "b"],
        "propertyNames": {"maxLength": 1},
    }
    ok, bad = submit_all(
        manager, [make_req("ok", json_schema=SCHEMA), make_req("u", json_schema=both)]
    )
    ready, failed = settle(manager, [ok, bad])
    assert ready == [ok] and failed == [bad]
    assert bad.finished_reason.status_code == 400
    assert "'propertyNames' (at /)" in bad.finished_reason.message


def test_checked_schema_is_served_with_a_value_checker(manager):
    """uniqueItems is served by the checked layer: a relaxed grammar and a checker (meta_info)."""
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    plain, checked = submit_all(
        manager, [make_req("ok", json_schema=SCHEMA), make_req("u", json_schema=unique)]
    )
    ready, failed = settle(manager, [plain, checked])
    assert ready == [plain, checked] and not failed
    assert checked.schema_checks == ("uniqueItems",) and checked.value_checker is not None
    assert plain.schema_checks == () and plain.value_checker is None


def test_fallback_disabled_refuses_with_the_configured_backend(tokenizer):
    gm = new_manager(tokenizer, disable_grammar_backend_fallback=True)
    try:
        _, failed = settle(gm, submit_all(gm, [make_req("p", json_schema=PATTERN_LEN)]))
        assert "'pattern with minLength/maxLength'" in failed[0].finished_reason.message
        assert gm.stats().grammar_backends_built == 1
    finally:
        gm.shutdown()


def test_compile_error_on_the_first_exact_backend_falls_back_to_the_next(manager, encode):
    """xgrammar's regex converter fails on a newline inside a character class (GitHub's
    workflow schema has one); llguidance compiles it, so the request is served, and the next
    request of that spec goes to llguidance first."""
    schema = {"type": "string", "pattern": "^[^\n]*$"}
    before = manager.stats().grammar_backend_compile_fallbacks
    first = make_req("nl0", json_schema=schema)
    ready, failed = settle(manager, submit_all(manager, [first]))
    assert ready == [first] and not failed
    assert first.grammar_backend == "llguidance"
    assert manager.stats().grammar_backend_compile_fallbacks == before + 1
    again = make_req("nl1", json_schema=schema)
    settle(manager, submit_all(manager, [again]))
    assert again.grammar_backend == "llguidance"
    assert manager.stats().grammar_backend_compile_fallbacks == before + 1
    assert again.grammar.accept_tokens(encode('"ab')) == len(encode('"ab'))
    escaped_newline = encode("\\n")  # "\" may start another escape; "\n" is refused
    assert again.grammar.accept_tokens(escaped_newline) < len(escaped_newline)


def test_outlines_default_falls_back_for_what_it_refuses(tokenizer):
    """outlines has no gap table: what it refuses at compile (numeric bounds) goes to xgrammar;
    a schema every backend rejects keeps the "invalid json_schema: " message of the first."""
    gm = new_manager(tokenizer, grammar_backend="outlines")
    try:
        bounded = {"type": "integer", "minimum": 18, "maximum": 99}
        broken = {"type": "object", "properties": 5}
        ok, bad = submit_all(
            gm, [make_req("b", json_schema=bounded), make_req("x", json_schema=broken)]
        )
        ready, failed = settle(gm, [ok, bad])
        assert ready == [ok] and failed == [bad]
        assert ok.grammar_backend == "xgrammar"
        assert bad.finished_reason.message.startswith("invalid json_schema:")
        assert bad.finished_reason.status_code == 400
    finally:
        gm.shutdown()


def test_the_backend_is_built_by_the_warm_up_thread_not_at_construction(tokenizer):
    """A scheduler reports ready before its grammar backend exists (importing xgrammar is ~1.2 s
    of a start); the warm-up thread builds it and starts its compile workers, so the first
    constrained request waits for neither; its counters read 0 until then."""
    gm = new_manager(tokenizer)
    try:
        stats = gm.stats()
        assert stats.grammar_backends_built == 0 and stats.grammar_compiles == 0
        assert gm._pools == {}  # no worker before the warm-up either
        gm.start_warm_up().join(60)
        assert gm.stats().grammar_backends_built == 1
        deadline = time.monotonic() + 60
        while len(gm.pool.worker_pids()) < gm.pool.workers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(gm.pool.worker_pids()) == gm.pool.workers  # started without any request
        assert gm.stats().grammar_compiles == 0
        req = make_req("w", json_schema=SCHEMA)
        ready, failed = settle(gm, submit_all(gm, [req]))
        assert ready == [req] and not failed
    finally:
        gm.shutdown()


def test_a_request_waits_for_a_warm_up_in_progress_and_is_served(tokenizer):
    gm = new_manager(tokenizer)
    try:
        thread = gm.start_warm_up()
        req = make_req("early", json_schema=SCHEMA)  # submitted while the thread builds
        ready, failed = settle(gm, submit_all(gm, [req]))
        thread.join(60)
        assert ready == [req] and not failed
        assert gm.stats().grammar_backends_built == 1  # built once, by one of the two
    finally:
        gm.shutdown()


def test_a_backend_that_cannot_be_built_fails_its_request_with_a_500(tokenizer, monkeypatch):
    """Built after the ready report, a broken backend (a library that fails to import) no longer
    fails the start: each constrained request gets a 500 naming it, and nothing else stops."""
    import radixgen.runtime.constrained.grammar_manager as gm_module

    def broken(name, vocab, config):
        raise ImportError(f"no module named {name}_native")

    monkeypatch.setattr(gm_module, "create_grammar_backend", broken)
    gm = new_manager(tokenizer)
    try:
        gm.start_warm_up().join(60)  # logs the failure, raises nothing
        req = make_req("b", json_schema=SCHEMA)
        ready, failed = settle(gm, submit_all(gm, [req]))
        assert not ready and failed == [req]
        reason = req.finished_reason
        assert reason.status_code == 500 and "xgrammar_native" in reason.message
    finally:
        gm.shutdown()
