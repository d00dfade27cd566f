#!/usr/bin/env bash
# Prepare, on a CPU machine, what travels to the lent GPU machine (see scripts/gpu_check.sh):
#   .whl/     wheels for its platform (Python 3.12, manylinux x86_64) of what it lacks, and
#             RadixGen itself (pip wheel --no-deps; gpu_check.sh puts the carried source tree
#             over it, so a wheel older than the tree does no harm)
#   .fi_aot/  flashinfer's attention modules compiled ahead of time (sm_90a) with nvcc
#   .gpu_model/  the default model's config, tokenizer and chat template, without its weights
#             (the GPU tests draw random weights of its shape: test/gpu_model.py); needs the
#             project's .venv (scripts/install.sh) to find the bundled model
# The folders are git-ignored; with the source tree they must stay under the 64 MiB a device
# call may carry. Then checks that the carried flashinfer imports on CPU torch and finds every
# module its backend plans prebuilt, and (where python3.12 exists) that the wheels install
# together for Python 3.12.
# Usage: bash scripts/prepare_gpu_carry.sh [--no-flashinfer-build | --rebuild]
#   --no-flashinfer-build  wheels only;  --rebuild  compile .fi_aot even if it is complete
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MODE=${1:-}

# One version of each (two of one package abort the install there). jsonschema (+ its three) and
# python-multipart are runtime dependencies the machine's image lacks. fastapi >= 0.150 needs
# opentelemetry-api, which the GPU machine lacks. flashinfer imports pynvml (nvidia-ml-py) when
# it loads; the GPU machine's list of packages does not name it, so it travels too (52 KB).
WHEELS=(
    flashinfer-python==0.6.13 apache-tvm-ffi==0.1.15.post2 nvidia-ml-py==13.615.71
    pyzmq==27.3.0 fastapi==0.140.13 starlette==1.10.0 uvicorn==0.54.0 orjson==3.13.0
    pydantic==2.14.4 pydantic-core==2.50.5 typing-extensions==4.16.0 typing-inspection==0.4.5
    annotated-types==0.8.0 xgrammar==0.2.9 outlines-core==0.2.14 llguidance==1.6.1 gguf==0.19.0
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
    python-multipart==0.0.34
)
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl . 2>/dev/null \
    || "$PY" -m pip wheel -q --no-deps -w .whl .
for name in "${WHEELS[@]%%==*}" radixgen; do  # exactly one wheel of each
    n=$(find .whl -maxdepth 1 -iname "$(echo "${name//-/_}" | tr '[:upper:]' '[:lower:]')-*.whl" | wc -l)
    [[ $n == 1 ]] || { echo "expected one wheel of $name in .whl, found $n" >&2; exit 1; }
done

# a venv of its own for flashinfer: CPU torch (dtypes and the ABI flag only) and its build deps
if [[ ! -x .fi_venv/bin/python ]]; then
    "$PY" -m venv .fi_venv
    .fi_venv/bin/pip install -q torch==2.13.0
    .fi_venv/bin/pip install -q --no-deps flashinfer-python==0.6.13
    .fi_venv/bin/pip install -q apache-tvm-ffi==0.1.15.post2 click einops ninja numpy \
        packaging requests tabulate tqdm nvidia-ml-py
fi

# the carried flashinfer wheel, unpacked with .fi_aot in its data/aot (as gpu_check.sh does)
check_aot() {
    local site
    site=$(mktemp -d)
    .fi_venv/bin/python -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        .whl/flashinfer_python-*.whl
    mkdir -p "$site/flashinfer/data/aot"
    [[ -d .fi_aot ]] && cp -r .fi_aot/. "$site/flashinfer/data/aot/"
    local rc=0
    # (no GPU here: the arch flashinfer would otherwise query)
    PYTHONPATH="$site" FLASHINFER_DISABLE_JIT=1 FLASHINFER_CUDA_ARCH_LIST=9.0 \
        .fi_venv/bin/python scripts/build_flashinfer_aot.py --check || rc=$?
    rm -rf "$site"
    return $rc
}

if [[ "$MODE" != "--no-flashinfer-build" ]]; then
    if [[ "$MODE" == "--rebuild" ]] || ! check_aot >/dev/null 2>&1; then
        # nvcc on PATH may be a wrapper: the link flags need the real CUDA root
        CUDA_HOME="$(dirname "$(echo | nvcc --dryrun -E -x cu - 2>&1 | sed -n 's/^#\$ _HERE_=//p')")"
        STUB=$(mktemp -d)  # no driver here: a stub libcuda to link against
        echo 'void radixgen_stub(void){}' | gcc -shared -x c - -Wl,-soname,libcuda.so.1 -o "$STUB/libcuda.so"
        WORKSPACE=$(mktemp -d)
        rm -rf .fi_aot
        CUDA_HOME="$CUDA_HOME" FLASHINFER_CUDA_ARCH_LIST=9.0 MAX_JOBS="${MAX_JOBS:-2}" \
            FLASHINFER_WORKSPACE_BASE="$WORKSPACE" FLASHINFER_EXTRA_LDFLAGS="-L$STUB" \
            .fi_venv/bin/python scripts/build_flashinfer_aot.py --out .fi_aot
        rm -rf "$STUB" "$WORKSPACE"
    fi
    echo "flashinfer from .whl on CPU torch, prebuilt modules from .fi_aot:"
    check_aot
fi

# a Python 3.12 here (PY312, else python3.12 on PATH or pyenv's) checks the set installs there
PY312=${PY312:-$(command -v python3.12 2>/dev/null || true)}
"${PY312:-false}" -m pip --version >/dev/null 2>&1 \
    || PY312=$(ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)
if [[ -n "$PY312" ]] && "$PY312" -m pip --version >/dev/null 2>&1; then
    site=$(mktemp -d)
    PIP_ROOT_USER_ACTION=ignore "$PY312" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
    echo "the wheels install together for Python 3.12 ($(ls "$site" | grep -c dist-info) packages)"
    rm -rf "$site"
fi

# the default model's config and tokenizer (3.5 MB), for the GPU tests' random-weight model
rm -rf .gpu_model
PYTHONPATH=test .venv/bin/python -c \
    'from pathlib import Path; from gpu_model import copy_template; copy_template(Path(".gpu_model"))'
ls .gpu_model/config.json .gpu_model/tokenizer.json >/dev/null

du -sh .whl .fi_aot .gpu_model 2>/dev/null || true
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
carry=$(du -cb .whl .fi_aot .gpu_model 2>/dev/null | tail -1 | cut -f1)
total=$((tree + carry))
echo "a device call carries $((total / 1048576)) MiB (tree $((tree / 1048576)), carry $((carry / 1048576))) of 64"
if ((total > 62 * 1024 * 1024)); then
    echo "too close to the 64 MiB a device call may take (the tree's untracked files count too)" >&2
    exit 1
fi
echo "ready: run with carry [\".whl\", \".fi_aot\", \".gpu_model\"]: bash scripts/gpu_check.sh"
