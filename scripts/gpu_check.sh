#!/usr/bin/env bash
# The one script run on the lent GPU machine (an H200; Python 3.12, torch cu130, triton, pytest;
# no network), from the repository root, carrying what scripts/prepare_gpu_carry.sh made:
#     carry [".whl", ".fi_aot", ".gpu_model"];  bash scripts/gpu_check.sh [--quick] [--allow-jit]
# Stages, each under its own `timeout`, the whole under 8 minutes there (so that a fresh start
# and a rerun fit the 15 minutes of device time):
#   0 install  the carried wheels (pip --target into a temp dir on PYTHONPATH), the carried
#              source tree over the radixgen wheel, .fi_aot into flashinfer/data/aot; versions,
#              nvidia-smi -L, and a check that every prebuilt flashinfer module loads
#   1 kernels  pytest -m gpu test/kernels (Triton and flashinfer against the torch reference)
#   2 models   pytest -m gpu test/models (CUDA graphs vs eager, the backends and fused ops in a
#              runner), before the engine tests: it holds the main graph check
#   3 engine   pytest -m gpu over the rest of test/ (engine and server on CUDA: test/gpu/, ...)
#   4 bench    benchmark/bench_offline.py --device cuda, short (a failure does not stop the run)
#     spec     benchmark/bench_spec.py --device cuda at concurrency 8 (reported, like bench)
#   5 summary  a table of the stages, printed last
# ONLY=kernels,engine (environment variable): run those of stages 1-4 alone (a rerun of what
# failed); install and environment always run.
# --quick: shorter caps and the benchmark's quick mode (a rerun). --allow-jit: let flashinfer
# compile what is missing (the first run sets FLASHINFER_DISABLE_JIT=1, proving the prebuilt set
# complete; a compile there takes ~20-60 s a module).
# NOTE: at most 8 files come back from $OUT: this writes 8 (env.log, kernels.log, models.log,
# engine.log, bench.log, spec.log, bench.md, summary.txt); add none without dropping one.
# Dry run on a CPU machine: OUT=/tmp/gpucheck bash scripts/gpu_check.sh (the worktree's .venv;
# the wheels are cp312, so the install stage runs only under a Python 3.12 with torch; the gpu
# tests skip, the benchmark needs CUDA).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
rm -f "$OUT"/{env,kernels,models,engine,bench,spec}.log "$OUT"/bench.md "$OUT"/summary.txt  # a rerun's logs
QUICK=0
JIT=0
for arg in "$@"; do
    case $arg in
    --quick) QUICK=1 ;;
    --allow-jit) JIT=1 ;;
    *) echo "usage: bash scripts/gpu_check.sh [--quick] [--allow-jit]" >&2; exit 2 ;;
    esac
done
if [[ -z "${PYTHON:-}" ]]; then  # the GPU machine's python3; a dev machine's worktree venv
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
BUDGET=520  # seconds for the whole script (each stage may overrun its cap by a 10 s kill grace)
if ((QUICK)); then
    CAP_INSTALL=30 CAP_KERNELS=60 CAP_MODELS=80 CAP_ENGINE=100 CAP_BENCH=60 CAP_SPEC=60
    BENCH_ARGS=(--quick --skip-hf)
else
    CAP_INSTALL=30 CAP_KERNELS=75 CAP_MODELS=100 CAP_ENGINE=150 CAP_BENCH=110 CAP_SPEC=90
    BENCH_ARGS=(--quick)
fi
STAGES=()
START=$SECONDS

# run NAME CAP LOG CMD...: CMD under `timeout` (capped by what is left of the budget), its output
# to the console and to $OUT/LOG; one summary row
run() {
    local name=$1 cap=$2 log=$3 left rc t0
    shift 3
    if [[ -n "${ONLY:-}" && $name != install && $name != environment && ",$ONLY," != *",$name,"* ]]; then
        STAGES+=("$name|SKIPPED (ONLY=$ONLY)|0|$log|")
        return
    fi
    left=$((BUDGET - (SECONDS - START)))
    ((cap > left)) && cap=$left
    if ((cap < 10)); then
        STAGES+=("$name|SKIPPED (out of time)|0|$log|")
        return
    fi
    echo "=== $name (cap ${cap} s): $*" | tee -a "$OUT/$log"
    t0=$SECONDS
    timeout -k 10 "$cap" "$@" 2>&1 | tee -a "$OUT/$log"
    rc=$?
    local status="ok" uncollected
    # a pytest run whose only errors are modules that did not import (test-only packages the
    # GPU machine lacks: jsonschema, openai, selenium, ...): its tests passed
    uncollected=$(grep -cE "^ERROR [^ :]+\.py( |$)" "$OUT/$log")
    if ((rc == 1 && uncollected > 0)) && ! grep -qE "^(FAILED |ERROR [^ ]+::)" "$OUT/$log"; then
        rc=0
        status="ok ($uncollected not collected)"
    fi
    case $rc in
    0) ;;
    124 | 137) status="TIMEOUT after ${cap} s" ;;
    5) status="no tests collected" ;;
    75) status="DRY RUN (pure wheels)" ;;
    *) status="FAILED (rc $rc)" ;;
    esac
    # pytest's last line ("12 passed, 3 skipped in 30.1s"), if any
    local tail_line
    tail_line=$(grep -E "(passed|failed|skipped|errors?|deselected|no tests ran).* in [0-9.]+s" \
        "$OUT/$log" | tail -1 | sed -E 's/^=+ //; s/ =+$//')
    STAGES+=("$name|$status|$((SECONDS - t0))|$log|$tail_line")
}

# --- 0: install and environment -----------------------------------------------------------
install_carry() {
    [[ -d .whl ]] || { echo "no .whl folder: run scripts/prepare_gpu_carry.sh and carry it" >&2; return 1; }
    local wheels=(.whl/*.whl) dry=0
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        echo "dry run: the carried wheels are for CPython 3.12 and $PYTHON is" \
            "$("$PYTHON" -c 'import platform; print(platform.python_version())'):" \
            "installing the pure-Python ones only (flashinfer among them)"
        wheels=(.whl/*-py3-none-any.whl)
        dry=1
    fi
    local SITE
    SITE=$(mktemp -d)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}" || return 1
    # the carried tree, not the (possibly older) radixgen wheel: a link tree of the folder map
    "$PYTHON" - "$SITE" <<'EOF' || return 1
import runpy, shutil, sys
from pathlib import Path

site, root = Path(sys.argv[1]), Path.cwd()
roots = runpy.run_path("python/radixgen/package_layout.py")["PACKAGE_ROOTS"]
shutil.rmtree(site / "radixgen", ignore_errors=True)
for name in sorted(roots, key=lambda n: n.count(".")):
    target = site.joinpath(*name.split("."))
    target.mkdir(parents=True, exist_ok=True)
    for child in sorted((root / roots[name]).iterdir()):
        if child.name != "__pycache__" and not (target / child.name).exists():
            (target / child.name).symlink_to(child)
EOF
    if [[ -d .fi_aot ]]; then
        mkdir -p "$SITE/flashinfer/data/aot" && cp -r .fi_aot/. "$SITE/flashinfer/data/aot/"
    else
        echo "no .fi_aot folder: flashinfer modules will be missing" >&2
    fi
    echo "installed into $SITE: $(ls "$SITE" | grep -c dist-info) packages"
    echo "$SITE" >"$SITE_FILE"
    ((dry)) && return 75
    return 0
}

environment() {
    echo "--- machine"
    uname -r
    nvidia-smi -L 2>&1 || echo "(no nvidia-smi)"
    echo "--- versions"
    "$PYTHON" - <<'EOF'
import importlib, platform
import torch

print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
print("torch DLPack exchange API", hasattr(torch.Tensor, "__dlpack_c_exchange_api__"))
for name in ("triton", "transformers", "flashinfer", "tvm_ffi", "xgrammar", "pydantic",
             "fastapi", "zmq", "radixgen"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"), mod.__file__)
    except Exception as exc:
        print(name, "NOT IMPORTABLE:", type(exc).__name__, exc)
EOF
    echo "--- prebuilt flashinfer modules (FLASHINFER_DISABLE_JIT=${FLASHINFER_DISABLE_JIT:-unset})"
    local load=()
    if "$PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
        load=(--load)
    else  # a dry run: no GPU for flashinfer to read the arch from
        export FLASHINFER_CUDA_ARCH_LIST=9.0
    fi
    "$PYTHON" scripts/build_flashinfer_aot.py --check "${load[@]}"
}

# NOTE: `timeout` runs programs, not shell functions: the stages' functions run in `bash -c`
export PYTHON OUT SITE_FILE
SITE_FILE=$(mktemp)
export -f install_carry environment
run install "$CAP_INSTALL" env.log bash -c install_carry
SITE=$(cat "$SITE_FILE")
rm -f "$SITE_FILE"
if [[ -n "$SITE" ]]; then
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    trap 'rm -rf "$SITE"' EXIT
fi
if ((JIT)); then
    unset FLASHINFER_DISABLE_JIT  # NOTE: flashinfer reads any value, even 0, as "disabled"
    export MAX_JOBS=16
else
    export FLASHINFER_DISABLE_JIT=1
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"))' 2>/dev/null; then
    export TVM_FFI_DISABLE_TORCH_C_DLPACK=1  # else tvm-ffi would compile a DLPack addon
fi
run environment 20 env.log bash -c environment

# --- 1-4: tests and benchmark --------------------------------------------------------------
PYTEST=("$PYTHON" -m pytest -q -p no:cacheprovider -m gpu --maxfail=10)
"$PYTHON" -c 'import pytest_timeout' 2>/dev/null && PYTEST+=(--timeout=120)  # per test
# jsonschema / openai / selenium are not carried: modules needing them fail to collect, the
# rest runs
PYTEST+=(--continue-on-collection-errors)
run kernels "$CAP_KERNELS" kernels.log "${PYTEST[@]}" test/kernels
# a test of test/models takes seconds once its Triton kernels are compiled; the first ones compile
# (tens of seconds on a fresh machine, more without the kernels stage's warm cache: ONLY=models
# twice hit the cap with no test output on 2026-12-04). One that stalls past 60 s gets its
# threads' stacks printed (pytest-timeout) before the stage's cap kills pytest silently.
MODELS_PYTEST=("${PYTEST[@]}")
"$PYTHON" -c 'import pytest_timeout' 2>/dev/null && MODELS_PYTEST+=(--timeout=60)
run models "$CAP_MODELS" models.log "${MODELS_PYTEST[@]}" test/models
# the engine and server modules with gpu-marked tests (collecting the whole suite would import
# test-only packages the machine lacks, and pytest counts those errors against --maxfail)
mapfile -t ENGINE_MODULES < <(grep -rlE "mark\.gpu\b" test --include='*.py' \
    | grep -vE '^test/(kernels|models)/' | sort)
run engine "$CAP_ENGINE" engine.log "${PYTEST[@]}" "${ENGINE_MODULES[@]}"
run bench "$CAP_BENCH" bench.log "$PYTHON" benchmark/bench_offline.py --device cuda \
    "${BENCH_ARGS[@]}" --results "$OUT/bench.md"

# the speculative-decoding benchmark's concurrency-8 rows on the GPU (random weights of the
# default shape: what verifying the drafts costs a step); its table goes into bench.md too
spec_bench() {
    local folder
    folder=$(mktemp -d)/model
    PYTHONPATH="test${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c 'import sys; from pathlib import Path
from gpu_model import random_default_shape_folder
random_default_shape_folder(Path(sys.argv[1]))' "$folder" || return 1
    "$PYTHON" benchmark/bench_spec.py --device cuda --model-path "$folder" --concurrency 8 \
        --results "$OUT/bench.md"
}
export -f spec_bench
run spec "$CAP_SPEC" spec.log bash -c spec_bench

# --- 5: summary ----------------------------------------------------------------------------
{
    echo
    echo "=== gpu_check summary ($(date -u +%FT%TZ), $((SECONDS - START)) s, quick=$QUICK, jit=$JIT)"
    printf '%-12s %-26s %6s  %-12s %s\n' stage status secs log result
    for row in "${STAGES[@]}"; do
        IFS='|' read -r name status secs log result <<<"$row"
        printf '%-12s %-26s %6s  %-12s %s\n' "$name" "$status" "$secs" "$log" "$result"
    done
} | tee "$OUT/summary.txt"
# the exit status: whether the install and the test stages passed (the benchmark is reported)
for row in "${STAGES[@]}"; do
    IFS='|' read -r name status _ <<<"$row"
    [[ $name == bench || $name == spec || $status == ok* || $status == SKIPPED\ \(ONLY* ]] || exit 1
done
exit 0
