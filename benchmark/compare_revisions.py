"""Before / after in one run: the offline benchmark of two checkouts, alternated on one machine.

Each checkout runs its own `benchmark/bench_offline.py --skip-hf` with its own interpreter (a venv
with that checkout installed editable), rounds alternating base, new, base, new, ... so that drift
of a noisy machine hits both sides alike. Prints one JSON line per run and a summary line with the
median of each figure per side and the new/base ratios.

    python benchmark/compare_revisions.py --base /path/to/old-checkout \
        [--base-python /path/to/old-checkout/.venv/bin/python] [--rounds 2] [--quick]

Make the base checkout with `git worktree add --detach /tmp/base REV`, then copy this venv into it
and `pip install --no-deps -e .` there (so both sides use the same packages).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("single_tok_per_s", "batched_tok_per_s")


def run_once(checkout: Path, python: str, quick: bool) -> dict[str, Any]:
    """One bench_offline run of `checkout`; returns its per-thread figures and summary."""
    cmd = [python, "benchmark/bench_offline.py", "--skip-hf", *(["--quick"] if quick else [])]
    proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: bench_offline failed\n{proc.stderr[-3000:]}")
    records = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    out: dict[str, Any] = {}
    for r in records:
        if r["bench"] in ("radixgen_single_stream", "radixgen_batched"):
            kind = "single" if r["bench"] == "radixgen_single_stream" else "batched"
            out[f"{kind}_t{r['threads']}"] = r["tok_per_s"]
        elif r["bench"] == "summary":
            out.update({k: r[k] for k in FIGURES})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="the 'before' checkout")
    ap.add_argument("--base-python", default=None, help="default: BASE/.venv/bin/python")
    ap.add_argument("--new", default=ROOT, type=Path, help="the 'after' checkout (this one)")
    ap.add_argument("--new-python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    base_python = args.base_python or str(args.base / ".venv" / "bin" / "python")
    sides = {"base": (args.base, base_python), "new": (args.new, args.new_python)}
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    for i in range(args.rounds):
        for side, (checkout, python) in sides.items():
            result = run_once(checkout, python, args.quick)
            runs[side].append(result)
            print(
                json.dumps({"bench": "revision_run", "side": side, "round": i, **result}),
                flush=True,
            )
    keys = sorted(set(runs["base"][0]) & set(runs["new"][0]))
    summary: dict[str, Any] = {"bench": "revision_compare", "rounds": args.rounds}
    for k in keys:
        base = statistics.median(r[k] for r in runs["base"])
        new = statistics.median(r[k] for r in runs["new"])
        summary[k] = {"base": round(base, 1), "new": round(new, 1), "ratio": round(new / base, 3)}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
