"""The engine on CUDA: greedy outputs of a default-shape model agree across attention backends,
CUDA graphs on and off, the radix cache on and off, and under retraction (issue 13, item 5).

Weights are random (tests/gpu_model.py): the bundled model cannot travel to the GPU machine.
bf16 runs differ in rounding, so a divergence is allowed only at a near-tie of the reference: at
the first differing position of a prompt, the reference's top-2 logprob gap must be below NEAR_TIE
and the case must have taken the reference's second choice. Every divergence is counted and
printed (the GPU check's log keeps them); later positions of a diverged prompt are not compared
(its contexts differ from there on).

NEAR_TIE is the rounding noise between runs as measured on the H200. The first bound, 0.01, was
set before any GPU run; the second, 0.1, on one 5-token prompt (backends moved its top-2 gap by
~0.05). The third run (2026-12-04, 7 cases x ~360 positions where the case and the reference
still agree and rank the same two tokens) measured how far rounding moves a top-2 gap: up to
0.36 (p99 0.20) for the reference's own backend with CUDA graphs and overlap, up to 0.48-0.50
(p99 0.40-0.44) for Triton and flashinfer; triton-no-overlap's one flip, at a reference gap of
0.349, is inside that. NEAR_TIE is that measured ceiling, 0.5. So that the wider bound cannot
hide a wrong kernel, the noise itself is bounded too, at about twice what was measured: a chosen
token's logprob moves by at most LOGPROB_NOISE_MAX (measured 0.07-0.14) and a top-2 gap by at
most GAP_NOISE_MAX (measured 0.36-0.50); a broken attention or graph path moves logits by units.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import radixgen

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

NEAR_TIE = 0.5
LOGPROB_NOISE_MAX = 0.3
GAP_NOISE_MAX = 1.0
NEW_TOKENS = 24
ENGINE_ARGS: dict[str, Any] = dict(
    device="cuda", grammar_backend="none", log_level="warning", cuda_graph_max_bs=16
)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    from gpu_model import random_default_shape_folder

    return str(random_default_shape_folder(tmp_path_factory.mktemp("default_shape")))


def prompts() -> list[list[int]]:
    """16 prompts: 8 share a 300-token prefix (the radix cache reuses it), lengths 5 to ~700."""
    shared = [(37 * i + 11) % 49000 + 100 for i in range(300)]
    out = [shared + [(13 * i + j) % 49000 + 50 for j in range(5 + 40 * i)] for i in range(8)]
    out += [[(17 * i + 7 * j) % 49000 + 80 for j in range(5 + 90 * i)] for i in range(8)]
    return out


def run(folder: str, **overrides: Any) -> list[dict[str, Any]]:
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    with radixgen.Engine(model_path=folder, **{**ENGINE_ARGS, **overrides}) as eng:
        outs: list[dict[str, Any]] = eng.generate(
            input_ids=prompts(), sampling_params=params, return_logprob=True, top_logprobs_num=2
        )
        states = eng.get_server_info()["internal_states"]
    outs[0]["retractions"] = sum(s.get("retractions", 0) for s in states)
    return outs


def divergences(
    ref: list[dict[str, Any]], got: list[dict[str, Any]]
) -> list[tuple[int, int, float, bool]]:
    """(prompt, position, reference top-2 gap there, whether the case took the reference's
    second choice) of each prompt's first differing token."""
    out = []
    for p, (a, b) in enumerate(zip(ref, got, strict=True)):
        k = first_difference(a, b)
        if k is not None:
            out.append((p, k, top2_gap(a, k), b["output_ids"][k] == top2(a, k)[1][1]))
    return out


def top2(out: dict[str, Any], k: int) -> list[Any]:
    return out["meta_info"]["output_top_logprobs"][k]


def top2_gap(out: dict[str, Any], k: int) -> float:
    top = top2(out, k)
    return float(top[0][0] - top[1][0])


def gap_noise(ref: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[float]:
    """|reference top-2 gap - the case's| at each position where both runs still agree and
    rank the same two tokens: how far rounding moves a gap, the quantity a flip is judged by."""
    out = []
    for a, b in zip(ref, got, strict=True):
        k = first_difference(a, b)
        for i in range(NEW_TOKENS if k is None else k):
            if [t[1] for t in top2(a, i)] == [t[1] for t in top2(b, i)]:
                out.append(abs(top2_gap(a, i) - top2_gap(b, i)))
    return sorted(out)


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    ids_a, ids_b = a["output_ids"], b["output_ids"]
    assert len(ids_b) == NEW_TOKENS
    return next((i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=True)) if x != y), None)


def logprob_noise(ref: list[dict[str, Any]], got: list[dict[str, Any]]) -> float:
    """The largest |difference| of the chosen token's logprob between the two runs over the
    positions where both still agree: how far rounding moved the model, for the log."""
    worst = 0.0
    for a, b in zip(ref, got, strict=True):
        k = first_difference(a, b)
        pairs = zip(
            a["meta_info"]["output_token_logprobs"],
            b["meta_info"]["output_token_logprobs"],
            strict=True,
        )
        for x, y in list(pairs)[: NEW_TOKENS if k is None else k]:
            worst = max(worst, abs(float(x[0]) - float(y[0])))
    return worst


def report(config: pytest.Config, line: str) -> None:
    """A line in the terminal output even when the test passes (the GPU check's log keeps it)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


@pytest.fixture(scope="module")
def reference(model_folder: str) -> Iterator[list[dict[str, Any]]]:
    """The torch backend on CUDA, eagerly: the oracle."""
    yield run(
        model_folder,
        attention_backend="torch",
        disable_cuda_graph=True,
        disable_overlap_schedule=True,
    )


# NOTE: on CUDA graphs and overlap scheduling are on by default: the reference runs without
# either, every case below with both unless it says otherwise
CASES = {
    # the reference's own backend with graphs and overlap: how far they alone move the outputs
    "torch-graphs": dict(attention_backend="torch"),
    "triton": dict(attention_backend="triton"),
    "triton-no-overlap": dict(attention_backend="triton", disable_overlap_schedule=True),
    "flashinfer": dict(attention_backend="flashinfer"),
    "flashinfer-page16": dict(attention_backend="flashinfer", page_size=16),
    "triton-no-radix-cache": dict(attention_backend="triton", disable_radix_cache=True),
    # a pool smaller than the prompts, and (almost) no room kept for the decode steps' tokens:
    # the running requests outgrow it and the newest go back to the queue
    "triton-retraction": dict(
        attention_backend="triton", max_total_tokens=3000, schedule_conservativeness=0.05
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_outputs_agree(
    case: str, model_folder: str, reference: list[dict[str, Any]], pytestconfig: pytest.Config
):
    if case.startswith("flashinfer"):
        pytest.importorskip("flashinfer")
    got = run(model_folder, **CASES[case])
    diverged = divergences(reference, got)
    gaps = [round(g, 4) for _, _, g, _ in diverged]
    # the case's own top-2 gap at each divergence (the same context as the reference's there)
    own = [(p, k, round(top2_gap(got[p], k), 4)) for p, k, _, _ in diverged]
    moved = gap_noise(reference, got)
    report(
        pytestconfig,
        f"GPU_PARITY {case}: {len(diverged)}/{len(got)} prompts diverged, gaps {gaps}, "
        f"the case's own gaps there {own}, "
        f"largest logprob change before a divergence {logprob_noise(reference, got):.4f}, "
        f"top-2 gap moved by max {moved[-1] if moved else 0:.4f} / p99 "
        f"{moved[int(0.99 * (len(moved) - 1))] if moved else 0:.4f} over {len(moved)} "
        f"positions, retractions {got[0].get('retractions')}",
    )
    assert all(g < NEAR_TIE and second for _, _, g, second in diverged), diverged
    assert logprob_noise(reference, got) < LOGPROB_NOISE_MAX
    assert len(moved) > 200 and moved[-1] < GAP_NOISE_MAX, (len(moved), moved[-5:])
    if case == "triton-retraction":
        assert got[0].get("retractions"), "the small pool should have forced a retraction"


def test_cache_hits_and_sampling_features_on_cuda(model_folder: str):
    """The radix cache shares the 300-token prefix on the GPU; every sampling parameter runs on
    the device, and seeds reproduce (the same batch from the same cache state)."""
    params = {
        "temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.02, "max_new_tokens": 12,
        "frequency_penalty": 0.3, "presence_penalty": 0.2, "repetition_penalty": 1.1,
        "logit_bias": {"100": 5.0}, "min_new_tokens": 4, "sampling_seed": 7, "ignore_eos": True,
    }  # fmt: skip
    with radixgen.Engine(model_path=model_folder, **ENGINE_ARGS) as eng:
        first, second = (
            eng.generate(input_ids=p, sampling_params={"max_new_tokens": 2}) for p in prompts()[:2]
        )
        # NOTE: each run from an empty cache: a prefill over a cached prefix rounds differently
        # in bf16 from one over the whole prompt, and a sample may follow that difference
        eng.flush_cache()
        a = eng.generate(input_ids=prompts()[:4], sampling_params=params)
        eng.flush_cache()
        b = eng.generate(input_ids=prompts()[:4], sampling_params=params)
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] >= 300
    assert [o["output_ids"] for o in a] == [o["output_ids"] for o in b]
    assert all(len(o["output_ids"]) == 12 for o in a)
