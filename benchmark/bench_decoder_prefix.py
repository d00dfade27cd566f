"""Prefix reuse for decoder embedders and yes/no rerankers (issue 33, item 3): the same prompts
through a `DecoderEmbeddingRunner` with its radix tree (the default) and with
`--disable-radix-cache`, in one run, alternating, on the default model (SmolLM2-135M-Instruct,
default dtype and quantization for this CPU).

- rerank: each query with its documents is one batch (as one /v1/rerank request reaches the
  scheduler), in the Qwen3-Reranker template: the template and the query are shared by every
  document's prompt; docs/s.
- instructed embedding: queries behind one task instruction (the Qwen3-Embedding kind), one
  batch per request of `--batch` queries; queries/s.

Vectors and scores are compared between the two runners (max abs difference).

    python benchmark/bench_decoder_prefix.py [--queries 8] [--docs 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from serving_workload import random_text

INSTRUCTION = (
    "Instruct: Given a web search query, retrieve relevant passages that answer it\nQuery: "
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=8)
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--doc-words", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from bench_quant import cpu_kind  # type: ignore[import-not-found]

    from radixgen.runtime.model_executor.decoder_embedding_runner import DecoderEmbeddingRunner
    from radixgen.runtime.model_executor.embedding_runner import EmbeddingJob
    from radixgen.runtime.model_loader import resolve_model_path
    from radixgen.runtime.text.rerank_prompt import DEFAULT_RERANK_TEMPLATE, rerank_prompt
    from radixgen.runtime.text.tokenizer import Tokenizer
    from radixgen.server_args import ServerArgs

    folder = resolve_model_path(None)
    tok = Tokenizer(folder)
    rng = random.Random(0)

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    rerank = [
        [
            EmbeddingJob(
                ids(rerank_prompt(DEFAULT_RERANK_TEMPLATE, q, random_text(rng, args.doc_words)))
            )
            for _ in range(args.docs)
        ]
        for q in (random_text(rng, 12) for _ in range(args.queries))
    ]
    queries = [EmbeddingJob(ids(INSTRUCTION + random_text(rng, 10))) for _ in range(args.batch * 4)]
    embed = [queries[i : i + args.batch] for i in range(0, len(queries), args.batch)]
    answer = tuple(tok.encode(t, add_special_tokens=False)[0] for t in ("yes", "no"))
    runners = {}
    for name, kw in (("tree", {}), ("no reuse", {"disable_radix_cache": True})):
        a = ServerArgs.from_kwargs(max_total_tokens=16384, **kw)
        runners[name] = (DecoderEmbeddingRunner(folder, a, None, answer),  # type: ignore[arg-type]
                         DecoderEmbeddingRunner(folder, a, None))  # fmt: skip
    rates: dict[str, dict[str, list[float]]] = {n: {"rerank": [], "embed": []} for n in runners}
    outs: dict[str, list[torch.Tensor]] = {}
    for rep in range(args.repeats + 1):  # the first round warms both
        names = list(runners) if rep % 2 == 0 else list(reversed(runners))
        for name in names:
            reranker, embedder = runners[name]
            reranker.flush_cache(), embedder.flush_cache()
            t = time.perf_counter()
            scores = [torch.stack(reranker.embed(batch)) for batch in rerank]
            rr = args.queries * args.docs / (time.perf_counter() - t)
            t = time.perf_counter()
            vecs = [torch.stack(embedder.embed(batch)) for batch in embed]
            er = len(queries) / (time.perf_counter() - t)
            outs[name] = [torch.cat(scores), torch.cat(vecs)]
            if rep:
                rates[name]["rerank"].append(rr)
                rates[name]["embed"].append(er)
    prompt_tokens = sum(len(j.input_ids) for b in rerank for j in b)
    reused = runners["tree"][0].cached_tokens / (args.repeats + 1)
    diff = [float((a - b).abs().max()) for a, b in zip(outs["tree"], outs["no reuse"], strict=True)]
    best = {n: {k: max(v) for k, v in r.items()} for n, r in rates.items()}
    print(json.dumps({
        "cpu": cpu_kind(), "queries": args.queries, "docs": args.docs,
        "rerank_prompt_tokens": prompt_tokens, "rerank_tokens_reused_per_round": round(reused),
        "rerank_docs_per_s": {n: round(b["rerank"], 1) for n, b in best.items()},
        "rerank_ratio": round(best["tree"]["rerank"] / best["no reuse"]["rerank"], 2),
        "embed_queries_per_s": {n: round(b["embed"], 1) for n, b in best.items()},
        "embed_ratio": round(best["tree"]["embed"] / best["no reuse"]["embed"], 2),
        "max_abs_diff_scores_vectors": diff,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
