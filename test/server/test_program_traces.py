"""Program traces end to end on the shared real server: a real `@function` with a fork, run with
`trace=True` through RuntimeEndpoint, read back from `/dashboard/api/traces[/<id>]` (the tree of
forks and calls, cached tokens per call), and the dashboard's Programs panel in headless Chromium
(helpers from test_dashboard.py)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

import radixgen as rg

from .test_dashboard import _app, _browser, artefacts_dir

# long enough (>= 64 characters new to the server) that fork() prefills it once for the branches
PREFIX = (
    "The radix cache keeps one copy of a shared prefix: every branch of this program starts "
    "from these same sentences, so only the first request computes them and the rest reuse "
    "the cached keys and values."
)


def test_trace_routes_are_behind_the_dashboards_key() -> None:
    client = _app(api_key="sekret")  # no engine: routes that pass the key see 'still loading'
    for path in ("/dashboard/api/traces", "/dashboard/api/traces/abc"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer sekret"}).status_code == 503
    client.get("/dashboard?api_key=sekret")  # the page's cookie admits them too
    assert client.get("/dashboard/api/traces").status_code == 503
    assert _app(enable_dashboard=False).get("/dashboard/api/traces").status_code == 404


@rg.function
def branches(s: Any, tag: str) -> None:
    s += f"Trace check {tag}. " + PREFIX
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += f" Option {i}:" + rg.gen("option", max_tokens=3, temperature=0)
    forks.join()
    s += " Verdict:" + rg.gen("verdict", max_tokens=3, temperature=0)


def _run_traced(base_url: str) -> Any:
    state = branches.run(tag=uuid.uuid4().hex[:8], backend=rg.RuntimeEndpoint(base_url), trace=True)
    assert state.error() is None, state.error()
    assert state.trace_id and len(state["option"]) == 3
    return state


def test_traced_fork_program_shows_as_a_tree(http: httpx.Client, base_url: str) -> None:
    state = _run_traced(base_url)
    listed = http.get("/dashboard/api/traces").json()["traces"]
    summary = next(t for t in listed if t["id"] == state.trace_id)
    assert summary["program"] == "branches" and summary["running"] == 0
    assert summary["requests"] == 5  # the fork's prefix prefill, three branch gens, the verdict
    snapshot = http.get("/dashboard/api/snapshot", params={"max_nodes": 1}).json()
    assert summary in snapshot["traces"]  # the page's stream carries the list too
    tree = http.get(f"/dashboard/api/traces/{state.trace_id}").json()
    nodes = {n["id"]: n for n in tree["nodes"]}
    assert len(nodes) == 10  # program, prefill, fork, 3 branches, 3 branch gens, verdict
    root = nodes[""]
    assert root["kind"] == "program" and root["parent"] is None
    assert root["children"] == ["#1", "fork2", "#3"]  # statement 0 is text: no request
    prefill, fork, verdict = nodes["#1"], nodes["fork2"], nodes["#3"]
    assert (prefill["kind"], prefill["label"]) == ("prefill", "fork prefix")
    assert fork["kind"] == "fork" and fork["children"] == ["fork2/0", "fork2/1", "fork2/2"]
    shared = prefill["prompt_tokens"]
    assert prefill["cached_tokens"] < shared // 2  # the prefix was new to the cache
    for i in range(3):
        branch = nodes[f"fork2/{i}"]
        assert branch["kind"] == "branch" and branch["parent"] == "fork2"
        (gen_id,) = branch["children"]
        gen = nodes[gen_id]
        assert (gen_id, gen["kind"], gen["label"]) == (f"fork2/{i}#0", "gen", "gen('option')")
        assert gen["requests"] == 1 and gen["completion_tokens"] == 3
        assert gen["cached_tokens"] >= shared - 2  # the branch reused the fork's prefix
        assert gen["computed_tokens"] == gen["prompt_tokens"] - gen["cached_tokens"] > 0
        assert gen["finish_reason"] == "length" and gen["total_s"] > 0
        assert abs(gen["queue_s"] + gen["prefill_s"] + gen["decode_s"] - gen["total_s"]) < 1e-6
    assert verdict["kind"] == "gen" and verdict["cached_tokens"] >= shared - 2
    assert root["prompt_tokens"] == tree["prompt_tokens"] == summary["prompt_tokens"]
    assert tree["cached_tokens"] >= 4 * (shared - 2)
    assert 0.5 < tree["cached_share"] == summary["cached_share"] < 1


def test_traced_batch_is_one_trace_with_an_item_per_program(
    http: httpx.Client, base_url: str
) -> None:
    @rg.function
    def short(s: Any, tag: str) -> None:
        s += f"Batch trace {tag}: " + rg.gen("x", max_tokens=2, temperature=0)

    backend = rg.RuntimeEndpoint(base_url)
    tag = uuid.uuid4().hex[:8]
    states = short.run_batch([{"tag": f"{tag}a"}, {"tag": f"{tag}b"}], backend=backend, trace=True)
    assert len({s.trace_id for s in states}) == 1 and states[0].trace_id
    tree = http.get(f"/dashboard/api/traces/{states[0].trace_id}").json()
    nodes = {n["id"]: n for n in tree["nodes"]}
    items = [c for c in nodes[""]["children"] if c.startswith("item")]
    assert sorted(items) == ["item0", "item1"]
    for item in items:
        assert nodes[item]["kind"] == "item" and nodes[f"{item}#0"]["kind"] == "gen"
    untraced = short.run(tag=tag, backend=backend)
    assert untraced.trace_id is None


def test_traced_stream_with_a_select_in_one_statement(http: httpx.Client, base_url: str) -> None:
    @rg.function
    def pick(s: Any, tag: str) -> None:
        s += (f"Stream trace {tag}: " + rg.gen("x", max_tokens=2, temperature=0) + " Pick:"
              + rg.select("c", choices=["yes", "no"]))  # fmt: skip

    state = pick.run(tag=uuid.uuid4().hex[:8], backend=rg.RuntimeEndpoint(base_url),
                     trace=True, stream=True)  # fmt: skip
    assert "Pick:" in "".join(state.text_iter()) and state.error() is None
    nodes = {
        n["id"]: n for n in http.get(f"/dashboard/api/traces/{state.trace_id}").json()["nodes"]
    }
    assert nodes[""]["children"] == ["#0", "#0.1"]  # two calls of one statement
    gen, select = nodes["#0"], nodes["#0.1"]
    assert (gen["kind"], gen["completion_tokens"], gen["requests"]) == ("gen", 2, 1)
    assert (select["kind"], select["label"]) == ("select", "select('c')")
    assert select["requests"] == 3  # the new text's prefill, then both choices scored at once
    assert select["cached_tokens"] > 0 and len(select["request_list"]) == 3


def test_trace_api_refuses_bad_input(http: httpx.Client) -> None:
    r = http.get("/dashboard/api/traces/no-such-trace")
    assert r.status_code == 404 and "no-such-trace" in r.json()["error"]["message"]
    for params in ({"limit": 0}, {"limit": "x"}, {"limit": 65}):
        r = http.get("/dashboard/api/traces", params=params)
        assert r.status_code == 400 and r.json()["error"]["param"] == "query.limit"
    bad = {"trace_id": "t", "node": "#0", "parent": "", "kind": "embed", "label": "x"}
    r = http.post("/generate", json={"text": "hi", "program_trace": bad})
    assert r.status_code == 400 and r.json()["error"]["param"] == "program_trace.kind"


def test_programs_panel_in_a_headless_browser(base_url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _browser()
    try:
        driver.get(f"{base_url}/dashboard?interval=0.5")
        wait = WebDriverWait(driver, 30, poll_frequency=0.2)
        # NOTE: the page redraws on every event: each read is one script returning plain values
        wait.until(lambda d: d.execute_script("return document.getElementById('status').innerText")
                   == "live")  # fmt: skip
        state = _run_traced(base_url)
        row = f'tr.trace[data-trace-id="{state.trace_id}"]'
        wait.until(lambda d: d.execute_script("return document.querySelector(arguments[0]) !== null",
                                              row))  # fmt: skip
        driver.execute_script("document.querySelector(arguments[0]).click()", row)

        def tree(d: Any) -> dict[str, Any] | None:
            return d.execute_script(
                """const head = document.getElementById('trace-head');
                   if (!head || head.dataset.traceId !== arguments[0]) return null;
                   const nodes = [...document.querySelectorAll('#trace .tnode')].map(e => ({
                     id: e.dataset.nodeId, kind: e.dataset.kind,
                     cached: +e.dataset.cachedTokens, text: e.innerText,
                     depth: (() => { let k = 0, p = e; while ((p = p.parentElement.closest('ul'))
                       && p.id !== 'trace') k++; return k; })(),
                   }));
                   return {head: head.innerText, nodes: nodes,
                           selected: document.querySelector(arguments[1]).className};""",
                state.trace_id,
                row,
            )

        wait.until(lambda d: (t := tree(d)) is not None and len(t["nodes"]) == 10)
        t = tree(driver)
        assert t is not None and "selected" in t["selected"] and "branches" in t["head"]
        gens = [n for n in t["nodes"] if n["kind"] == "gen"]
        assert len(gens) == 4  # a node per gen: three branches and the verdict
        for n in gens:
            assert n["cached"] > 0 and "cached +" in n["text"] and "% cached" in n["text"]
        by_id = {n["id"]: n for n in t["nodes"]}
        assert by_id["fork2"]["kind"] == "fork" and by_id["fork2/1"]["kind"] == "branch"
        assert by_id["fork2/1#0"]["depth"] == by_id["fork2/1"]["depth"] + 1 == 4  # nested in it
        wait.until(lambda d: d.execute_script(  # the list has caught up: nothing runs
            "return document.querySelector(arguments[0]).innerText", row).split("\t")[2] == "5")  # fmt: skip
        driver.execute_script("document.getElementById('programs-panel').scrollIntoView()")
        shot = artefacts_dir() / "dashboard-programs.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
