"""`--dp-size 2` on one GPU (issue 36, item 3): two scheduler replicas share the device, each
with its own KV pool sized within its part of it, and serve requests concurrently."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

PARAMS = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from gpu_model import random_default_shape_folder
    from server.server_process import running_server

    folder = random_default_shape_folder(tmp_path_factory.mktemp("default_shape"))
    flags = ("--model-path", str(folder), "--device", "cuda", "--dp-size", "2",
             "--log-level", "warning")  # fmt: skip
    with running_server(*flags) as proc:
        yield proc.url


def replica_states(url: str) -> list[dict]:
    r = httpx.get(f"{url}/server_info", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["internal_states"]


def test_two_replicas_share_the_gpu_and_serve_concurrently(server: str):
    states = replica_states(server)
    assert len(states) == 2
    pools = [s["max_total_num_tokens"] for s in states]
    assert all(p > 0 for p in pools) and max(pools) <= 1.25 * min(pools), pools
    before = [s["prompt_tokens"] for s in states]
    prompts = [f"Request {i}: tell me about the number {i * 7}." for i in range(16)]

    def post(text: str) -> dict:
        body = {"text": text, "sampling_params": PARAMS}
        r = httpx.post(f"{server}/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(post, prompts))
    assert all(o["meta_info"]["completion_tokens"] == 16 for o in outs)
    after = [s["prompt_tokens"] for s in replica_states(server)]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_each_replica_gives_the_same_greedy_answer(server: str):
    texts = []
    for rank in (0, 1):
        body = {"text": "The same prompt on each replica:", "data_parallel_rank": rank,
                "sampling_params": PARAMS}  # fmt: skip
        r = httpx.post(f"{server}/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        texts.append(r.json()["text"])
    assert texts[0] == texts[1]
