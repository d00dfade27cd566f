"""HiCache over HTTP on a real server (a small pool, the file tier on): `/hicache` shows the
tiers, `/flush_cache?pool_only=true` keeps the lower tiers (the next request is served from the
file tier, `meta_info.cached_tokens_details` says so, `/metrics` counts it by tier), and a plain
`/flush_cache` empties every tier."""

from __future__ import annotations

import httpx
import pytest

from .server_process import running_server, server_flags

pytestmark = pytest.mark.slow  # starts a server

FACTS = ". ".join(f"Fact {i}: the lake number {i} is {i * 5 % 11}" for i in range(12))
PROMPT = f"Read about lakes. {FACTS}.\nQuestion: what is the lake number 4?\nAnswer:"
BODY = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 6}}


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("hicache"))
    flags = (
        "--enable-metrics",
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "file",
        "--hicache-file-dir",
        folder,
        "--max-total-tokens",
        "320",
        *server_flags(),
    )
    with running_server(*flags) as proc, httpx.Client(base_url=proc.url, timeout=120) as client:
        yield client


def test_status_pool_only_flush_storage_hits_metrics_and_full_flush(http):
    first = http.post("/generate", json=BODY).json()
    status = http.get("/hicache").json()
    assert status["enabled"] and status["storage_backend"] == "file"
    assert status["write_policy"] == "write_through"
    (tiers,) = status["replicas"]
    assert set(tiers) == {"device", "host", "storage"}
    assert tiers["device"]["capacity_tokens"] == 320
    assert tiers["storage"]["blocks"] == first["meta_info"]["prompt_tokens"] // 16

    assert http.post("/flush_cache?pool_only=true").status_code == 200
    again = http.post("/generate", json=BODY).json()
    details = again["meta_info"]["cached_tokens_details"]
    assert details["storage"] >= 160 and details["device"] == 0, details
    assert again["output_ids"] == first["output_ids"]
    tiers = http.get("/hicache").json()["replicas"][0]
    assert tiers["storage"]["hit_tokens"] == details["storage"]

    metrics = http.get("/metrics").text
    assert f'radixgen_hicache_cached_tokens_total{{tier="storage"}} {details["storage"]}.0' in (
        metrics
    )
    assert 'cache_source="storage"' in metrics

    assert http.post("/flush_cache").status_code == 200
    tiers = http.get("/hicache").json()["replicas"][0]
    assert tiers["storage"]["blocks"] == 0 and tiers["host"]["used_tokens"] == 0
    cold = http.post("/generate", json=BODY).json()
    assert cold["meta_info"]["cached_tokens"] == 0
    assert cold["output_ids"] == first["output_ids"]


def test_dashboard_shows_what_each_tier_holds_and_served(http):
    """The dashboard's snapshot carries the tiers' counters and the page shows them (a real
    headless browser, as test_dashboard.py drives it)."""
    from selenium.webdriver.support.ui import WebDriverWait

    from .test_dashboard import _browser

    http.post("/generate", json=BODY)
    assert http.post("/flush_cache?pool_only=true").status_code == 200
    assert http.post("/generate", json=BODY).json()["meta_info"]["cached_tokens_details"]["storage"]
    tiers = http.get("/hicache").json()["replicas"][0]
    state = http.get("/dashboard/api/snapshot").json()["state"]
    assert state["storage_hit_tokens"] == tiers["storage"]["hit_tokens"] > 0
    assert state["host_capacity_tokens"] == tiers["host"]["capacity_tokens"]

    driver = _browser()
    try:
        driver.get(f"{http.base_url}/dashboard?interval=0.5")

        def tier_text(d):
            return d.execute_script(
                "const e = document.getElementById('hicache-tiers');"
                "return e.hidden ? null : e.innerText"
            )

        text = WebDriverWait(driver, 30, poll_frequency=0.2).until(tier_text)
        assert f"served {tiers['storage']['hit_tokens']}" in text, text
        assert f"{tiers['storage']['blocks']} blocks" in text, text
        assert f"/ {tiers['host']['capacity_tokens']} tokens" in text, text
    finally:
        driver.quit()


def test_prefix_hints_pin_the_prompt_in_the_host_tier(http):
    """`pin_prefix` on /generate, and the DSL's prefix hints with `pin_cached_prefixes` on: the
    prompt's whole blocks are pinned in the host tier (`/hicache` counts them) and a flush of
    every tier releases them."""
    import radixgen as rg
    from radixgen.lang.backend.runtime_endpoint import RuntimeEndpoint

    assert http.post("/flush_cache").status_code == 200
    bad = http.post("/generate", json={**BODY, "pin_prefix": "yes"})
    assert bad.status_code == 400 and "pin_prefix" in bad.text
    body = {**BODY, "sampling_params": {"max_new_tokens": 0}, "pin_prefix": True}
    prompt_tokens = http.post("/generate", json=body).json()["meta_info"]["prompt_tokens"]
    host = http.get("/hicache").json()["replicas"][0]["host"]
    assert host["pinned_tokens"] == prompt_tokens // 16 * 16 > 0

    endpoint = RuntimeEndpoint(str(http.base_url))
    other = "Another long shared prefix. " + FACTS.replace("lake", "river")
    endpoint.cache_prefix(other)  # the hint's flag is off: nothing more pinned
    assert (
        http.get("/hicache").json()["replicas"][0]["host"]["pinned_tokens"] == host["pinned_tokens"]
    )
    rg.global_config.pin_cached_prefixes = True
    try:
        endpoint.cache_prefix(other)
    finally:
        rg.global_config.pin_cached_prefixes = False
    pinned = http.get("/hicache").json()["replicas"][0]["host"]["pinned_tokens"]
    assert pinned > host["pinned_tokens"] + 100

    assert http.post("/flush_cache").status_code == 200
    assert http.get("/hicache").json()["replicas"][0]["host"]["pinned_tokens"] == 0
