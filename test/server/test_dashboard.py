"""The live dashboard: its switch, its key handling, its JSON / SSE API on the shared real server,
and the page itself in a real headless Chromium (Debian's `chromium` + `chromium-driver`, driven
by Selenium; nothing is downloaded at run time). The browser test saves a screenshot under
$RADIXGEN_TEST_ARTEFACTS (default test/artefacts/)."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from radixgen.runtime.dashboard.auth import DASHBOARD_COOKIE, dashboard_token
from radixgen.runtime.entrypoints.http_server import create_app
from radixgen.runtime.entrypoints.server_state import ServerState
from radixgen.server_args import HttpConfig, ServerArgs, dashboard_enabled

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromedriver")
INSTALL_HINT = (
    "the browser test needs Debian's chromium and chromium-driver and Selenium: as root, "
    "`bash scripts/install.sh test` (or `apt-get install chromium chromium-driver` and "
    "`pip install selenium`)"
)


# --- no server: the switch and the page's key handling ----------------------------------------


def test_dashboard_is_on_for_loopback_binds_only_by_default() -> None:
    assert dashboard_enabled(HttpConfig(host="127.0.0.1"))
    assert dashboard_enabled(HttpConfig(host="localhost"))
    assert not dashboard_enabled(HttpConfig(host="0.0.0.0"))
    assert dashboard_enabled(HttpConfig(host="0.0.0.0", enable_dashboard=True))
    assert not dashboard_enabled(HttpConfig(host="127.0.0.1", enable_dashboard=False))


def test_cli_flag_turns_it_on_or_off() -> None:
    import argparse

    from radixgen.server_args import add_cli_args, from_cli_namespace

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    parse = parser.parse_args
    assert from_cli_namespace(parse([])).http.enable_dashboard is None
    assert from_cli_namespace(parse(["--enable-dashboard"])).http.enable_dashboard is True
    assert from_cli_namespace(parse(["--no-enable-dashboard"])).http.enable_dashboard is False


def _app(**flags: Any) -> TestClient:
    """The real app without its engine (the lifespan never runs: routes see 'still loading')."""
    state = ServerState(ServerArgs.from_kwargs(**flags), request_exit=lambda code: None)
    return TestClient(create_app(state), base_url="http://127.0.0.1")


def test_page_trades_the_key_for_a_dashboard_cookie() -> None:
    client = _app(api_key="sekret")
    assert client.get("/dashboard").status_code == 401
    r = client.get("/dashboard?api_key=sekret&max_nodes=50", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/dashboard?max_nodes=50"  # the key leaves the address bar
    cookie = r.headers["set-cookie"]
    assert "sekret" not in cookie
    assert f"{DASHBOARD_COOKIE}={dashboard_token('sekret')}" in cookie
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    assert "Path=/dashboard" in cookie
    page = client.get("/dashboard?max_nodes=50")  # the client now sends the cookie
    assert page.status_code == 200 and "<title>RadixGen dashboard</title>" in page.text
    js = client.get("/dashboard/static/dashboard.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert client.get("/dashboard/static/../auth.py").status_code == 404
    api = client.get("/dashboard/api/snapshot")
    assert api.status_code == 503 and "still loading" in api.json()["error"]["message"]
    assert client.get("/server_info").status_code == 401  # the cookie opens the dashboard only


def test_dashboard_off_means_no_routes() -> None:
    client = _app(enable_dashboard=False)
    assert client.get("/dashboard").status_code == 404
    assert client.get("/dashboard/api/snapshot").status_code == 404


# --- the shared real server -------------------------------------------------------------------


def _shared_prefix_prompts(http: httpx.Client, n: int) -> tuple[list[list[int]], int]:
    """n prompts (token ids) that share a prefix no other test sends; the shared length."""
    tag = uuid.uuid4().hex[:8]
    prefix = http.post(
        "/tokenize",
        json={"prompt": f"Dashboard check {tag}: the radix tree keeps this sentence once."},
    ).json()["tokens"]
    tails = ["Alpha", "Bravo", "Charlie", "Delta"][:n]
    ids = [
        prefix + http.post("/tokenize", json={"prompt": f" {t} says", "add_special_tokens": False})
        .json()["tokens"]
        for t in tails
    ]  # fmt: skip
    return ids, len(prefix)


def _send(http: httpx.Client, prompts: list[list[int]], tag: str) -> list[str]:
    rids = []
    for i, ids in enumerate(prompts):  # one after another: each later one reuses the first's KV
        rid = f"dash-{tag}-{i}"
        r = http.post(
            "/generate",
            json={"input_ids": ids, "rid": rid,
                  "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        rids.append(rid)
    return rids


def test_api_shows_the_shared_prefix_and_counters_move(http: httpx.Client) -> None:
    before = http.get("/dashboard/api/snapshot").json()
    prompts, shared = _shared_prefix_prompts(http, 3)
    rids = _send(http, prompts, uuid.uuid4().hex[:6])
    view = http.get("/dashboard/api/snapshot", params={"max_nodes": 2000}).json()
    nodes = {n["id"]: n for n in view["tree"]["nodes"]}
    (node,) = [n for n in nodes.values() if n["prefix_tokens"] == shared and n["hits"] >= 2]
    assert node["children"] >= 3  # one branch per prompt
    parent_prefix = nodes[node["parent"]]["prefix_tokens"] if node["parent"] != -1 else 0
    assert node["tokens"] == shared - parent_prefix
    assert "sentence once" in node["preview"]
    by_rid = {r["rid"]: r for r in view["requests"]}
    assert by_rid[rids[0]]["computed_tokens"] == len(prompts[0])  # nothing of it was cached
    for rid, ids in zip(rids[1:], prompts[1:], strict=True):
        r = by_rid[rid]
        assert (r["state"], r["finish_reason"]) == ("finished", "length")
        assert r["cached_tokens"] == shared and r["computed_tokens"] == len(ids) - shared
        assert r["arrival"] <= r["admitted"] <= r["first_token"] <= r["finished"]
        assert r["completion_tokens"] == 4 and r["output"]
    st0, st1 = before["state"], view["state"]
    assert st1["generated_tokens"] >= st0["generated_tokens"] + 12
    assert st1["cached_tokens"] >= st0["cached_tokens"] + 2 * shared
    assert st1["forward_steps"] > st0["forward_steps"]
    assert view["steps"] and set(view["batch"]) >= {"decode_rows", "prefill_rows", "grammar_rows"}
    assert view["history"][-1]["time"] == view["time"]


def test_api_refuses_bad_input(http: httpx.Client) -> None:
    for params in ({"max_nodes": 0}, {"max_nodes": "many"}, {"max_nodes": 10**6}):
        r = http.get("/dashboard/api/snapshot", params=params)
        assert r.status_code == 400 and r.json()["error"]["param"] == "query.max_nodes"
    r = http.get("/dashboard/api/stream", params={"interval": 0.01})
    assert r.status_code == 400 and r.json()["error"]["param"] == "query.interval"
    assert http.get("/dashboard/static/nope.js").status_code == 404


def test_stream_sends_a_view_per_interval(http: httpx.Client) -> None:
    events: list[dict] = []
    t0 = time.monotonic()
    with http.stream("GET", "/dashboard/api/stream", params={"interval": 0.3}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            if len(events) == 3:
                break
    assert time.monotonic() - t0 >= 0.5  # paced, not a burst
    assert events[0]["time"] < events[1]["time"] < events[2]["time"]
    assert all("tree" in e and "state" in e for e in events)
    assert http.get("/health").status_code == 200  # closing the stream left the server well


# --- a real browser ---------------------------------------------------------------------------


def _browser() -> Any:
    missing = [p for p in CHROMIUM if not shutil.which(p)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{', '.join(missing)} missing on CI: {INSTALL_HINT}")
        pytest.skip(f"{', '.join(missing)} missing: {INSTALL_HINT}")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM[0]
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,900"):  # fmt: skip
        opts.add_argument(flag)
    return webdriver.Chrome(options=opts, service=Service(CHROMIUM[1]))


def artefacts_dir() -> Path:
    path = Path(os.environ.get("RADIXGEN_TEST_ARTEFACTS") or ROOT / "test" / "artefacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_page_in_a_headless_browser(http: httpx.Client, base_url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _browser()
    try:
        driver.get(f"{base_url}/dashboard?max_nodes=2000&interval=0.5")
        wait = WebDriverWait(driver, 30, poll_frequency=0.2)

        # NOTE: the page redraws on every event, so an element found by one WebDriver call may be
        # gone by the next (CI saw StaleElementReferenceException): every read below is one
        # script, which runs between redraws and returns plain values.
        def text_of(d: Any, element_id: str) -> str:
            return d.execute_script(
                "return document.getElementById(arguments[0]).innerText", element_id
            )

        wait.until(lambda d: text_of(d, "status") == "live")
        generated_before = int(text_of(driver, "generated-tokens"))
        prompts, shared = _shared_prefix_prompts(http, 3)
        tag = uuid.uuid4().hex[:6]
        rids = _send(http, prompts, tag)
        node_css = f'.node[data-prefix-tokens="{shared}"]'

        def shared_node(d: Any) -> dict[str, str] | None:
            return d.execute_script(
                """for (const el of document.querySelectorAll(arguments[0])) {
                     if (+el.dataset.hits >= 2 && el.innerText.includes('sentence once'))
                       return {id: el.dataset.nodeId, text: el.innerText};
                   }
                   return null;""",
                node_css,
            )

        wait.until(lambda d: (n := shared_node(d)) is not None and "2 hits" in n["text"])
        wait.until(lambda d: int(text_of(d, "generated-tokens")) >= generated_before + 12)
        row_css = f'tr.req[data-rid="{rids[1]}"]'
        computed = len(prompts[1]) - shared
        expected = [f"{len(prompts[1])} ({shared} + {computed})", "length"]

        def row_cells(d: Any) -> list[str] | None:
            return d.execute_script(
                """const row = document.querySelector(arguments[0]);
                   if (!row) return null;
                   const cells = row.querySelectorAll('td');
                   return [cells[2].innerText, cells[5].innerText];""",
                row_css,
            )

        wait.until(lambda d: row_cells(d) == expected)
        assert driver.find_elements(By.CSS_SELECTOR, f"{row_css} svg.timeline rect")
        driver.execute_script("document.querySelector(arguments[0]).click()", row_css)  # text opens
        detail_css = f'tr.detail[data-rid="{rids[1]}"]'
        wait.until(lambda d: d.execute_script(
            """return [...document.querySelectorAll(arguments[0])]
                 .some(e => e.innerText.includes('Bravo says'));""", detail_css))  # fmt: skip
        node = shared_node(driver)
        assert node is not None
        node_id = node["id"]
        node_sel = f'.node[data-node-id="{node_id}"]'
        driver.execute_script(
            "document.querySelector(arguments[0]).click()", node_sel
        )  # fold the shared node: its branches are hidden
        wait.until(lambda d: d.execute_script(
            """const el = document.querySelector(arguments[0]);
               return el !== null && el.classList.contains('folded');""", node_sel))  # fmt: skip
        shot = artefacts_dir() / "dashboard.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe  # no script error, no failed asset
    finally:
        driver.quit()
