"""`bench_offline.py --device cuda --dry-run`: the GPU benchmark's every step (random model
folder, engines with graphs, the radix cache and overlap on/off, HF generate, the summary) runs on
CPU with a miniature model, so the script the GPU machine runs is checked here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # starts four Engines
def test_cuda_mode_runs_every_step_on_cpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "benchmark/bench_offline.py", "--device", "cuda", "--dry-run",
         "--model-dir", str(tmp_path / "model")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kinds = [(r["bench"], r.get("engine"), r.get("cuda_graphs"), r.get("radix_cache"))
             for r in records]  # fmt: skip
    for bs in (1, 4):
        assert sum(r["bench"] == "cuda_decode" and r["batch"] == bs for r in records) == 4
    assert kinds.count(("cuda_decode", "radixgen", False, True)) == 2  # graphs off
    decodes = [r for r in records if r["bench"] == "cuda_decode" and r["engine"] == "radixgen"]
    assert sum(not r["overlap"] for r in decodes) == 2  # overlap off, at both batch sizes
    assert all(0 < r["host_ms_per_step"] <= r["scheduler_ms_per_step"] for r in decodes)
    assert ("cuda_shared_prefix", "radixgen", True, True) in kinds
    assert ("cuda_shared_prefix", "radixgen", True, False) in kinds
    assert ("cuda_shared_prefix", "hf_generate", None, None) in kinds
    prefix = {r["radix_cache"]: r for r in records if r["bench"] == "cuda_shared_prefix"
              and r["engine"] == "radixgen"}  # fmt: skip
    assert prefix[True]["cached_tokens"] >= 4 * 48 and prefix[False]["cached_tokens"] == 0
    summary = records[-1]
    assert summary["bench"] == "cuda_summary" and summary["batch1"]["vs_hf"] > 0
    assert 0 < summary["batch4"]["overlap_off_host_share"] <= 1
    assert (tmp_path / "model" / "tokenizer.json").exists()
