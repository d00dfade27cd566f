"""The default model kept quantized with float32 activations against the int8-activation modes
(RADIXGEN_CPU_ACT_QUANT), interleaved in one run: rounds in which every mode starts its Engine
(all threads; one at a time: an idle scheduler still polls) and runs single-stream decode (128
tokens), 32 x 128 and 64 x 128 batch decode (and llama.cpp single-stream, 1 and all threads,
when llama-cpp-python is installed), so a noisy shared machine drifts alike for all. Prints one JSON line per figure, then per mode its best over the rounds
and the ratios to "off".

    python benchmark/bench_act_quant.py [--modes off,mixed,int8x2,int8] [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import os

from bench_offline import (  # type: ignore[import-not-found]
    chat_prompts,
    emit,
    ours_batched,
    ours_single_stream,
)
from bench_quant import llama_cpp_single  # type: ignore[import-not-found]

import radixgen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="off,mixed,int8x2,int8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="16 tokens, 8 prompts (smoke run)")
    args = ap.parse_args()
    from radixgen.runtime.model_loader import resolve_model_path
    from radixgen.runtime.model_loader.resolve import default_model_file
    from radixgen.runtime.text.tokenizer import Tokenizer

    new = 16 if args.quick else 128
    batches = (8,) if args.quick else (32, 64)
    tokenizer = Tokenizer(resolve_model_path(None))
    prompts = chat_prompts(tokenizer, max(batches))
    modes = args.modes.split(",")
    best: dict[str, dict[str, float]] = {m: {} for m in modes}
    try:
        import llama_cpp  # type: ignore[import-not-found,import-untyped]  # noqa: F401

        llama = True
    except ImportError:
        llama = False
    for r in range(args.rounds):
        for mode in modes:
            os.environ["RADIXGEN_CPU_ACT_QUANT"] = mode  # the scheduler child inherits it
            with radixgen.Engine(
                grammar_backend="none", log_level="warning", max_total_tokens=16384
            ) as eng:
                info = eng.get_server_info()
                fig = {"single": ours_single_stream(eng, prompts[0], new)}
                for b in batches:
                    fig[f"batch{b}"] = ours_batched(eng, prompts[:b], new)
            emit({"bench": "round", "round": r, "mode": mode, "kernel_isa": info["kernel_isa"],
                  "kernel_act_quant": info["kernel_act_quant"], **fig})  # fmt: skip
            for key, v in fig.items():
                best[mode][key] = max(best[mode].get(key, 0.0), v)
        del os.environ["RADIXGEN_CPU_ACT_QUANT"]
        if llama:
            for threads in (1, len(os.sched_getaffinity(0))):
                tps = llama_cpp_single(default_model_file(), prompts[0], new, threads)
                emit({"bench": "round", "round": r, "mode": f"llama_cpp_t{threads}",
                      "single": tps})  # fmt: skip
                got = best.setdefault("llama_cpp", {})
                got["single"] = max(got.get("single", 0.0), tps)
    for mode, fig in best.items():
        ratios = {
            f"{k}_vs_off": v / best["off"][k] for k, v in fig.items() if k in best.get("off", {})
        }
        emit({"bench": "best", "mode": mode, **fig, **ratios})


if __name__ == "__main__":
    main()
