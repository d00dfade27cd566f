"""A RAG pipeline on RadixGen alone: embed a corpus, retrieve by cosine, rerank, answer.

1. Embed: the corpus (examples/data/corpus.jsonl) and the question, with an embedding model:
   an embedding server (`radixgen serve --is-embedding --port 30001`, all-MiniLM-L6-v2 by
   default; `--embed-url`) or an in-process `Engine(is_embedding=True)` (`--embed-engine`).
2. Retrieve: the top `--k` passages by cosine similarity (the vectors are L2-normalised).
3. Rerank: the generation model judges each candidate with a yes/no `select` (the normalised
   log-probability of "yes" is the score), all candidates in one `run_batch`. The instruction and
   its few-shot block open every judgement, so the radix cache computes them once. (The default
   135M model is a weak judge: the best `keep` of the `k` go on, not only the first.)
4. Answer: a `@function` whose few-shot block comes first (shared by every question), then the
   reranked passages, then the question, and a citation picked with `select`.

    radixgen serve --port 30000 & radixgen serve --is-embedding --port 30001 &
    python examples/rag_pipeline.py "Which planet is the hottest?"
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import add_backend_args, connect

import radixgen as rg

CORPUS = Path(__file__).parent / "data" / "corpus.jsonl"
Embed = Callable[[list[str]], list[list[float]]]

JUDGE_SHOTS = (
    "Decide whether the passage answers the question. Reply yes or no.\n\n"
    "Question: What is the capital of Japan?\nPassage: Tokyo is the capital of Japan.\n"
    "Relevant: yes\n\n"
    "Question: What is the capital of Japan?\nPassage: Rice is a staple food in Asia.\n"
    "Relevant: no\n\n"
)
ANSWER_SHOTS = (
    "Answer the question from the passages and cite the source.\n\n"
    "Passages:\n[1] The Nile is the longest river in Africa.\n[2] Rice is a staple food in Asia.\n"
    "Question: Which is the longest river in Africa?\nAnswer: The Nile. Source: [1]\n\n"
)


def load_corpus(path: Path = CORPUS) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def server_embedder(url: str) -> Embed:
    """Vectors from an embedding server's OpenAI-compatible /v1/embeddings."""
    from openai import OpenAI

    client = OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none")

    def embed(texts: list[str]) -> list[list[float]]:
        out = client.embeddings.create(model="default", input=texts)
        return [d.embedding for d in sorted(out.data, key=lambda d: d.index)]

    return embed


def engine_embedder(engine: Any) -> Embed:
    """Vectors from an in-process `Engine(is_embedding=True)`."""

    def embed(texts: list[str]) -> list[list[float]]:
        out = engine.encode(texts)
        return [r["embedding"] for r in (out if isinstance(out, list) else [out])]

    return embed


class VectorIndex:
    """Passages and their unit vectors: retrieval is a dot product."""

    def __init__(self, docs: list[dict[str, str]], embed: Embed) -> None:
        self.docs, self.embed = docs, embed
        self.vectors = embed([f"{d['title']}: {d['text']}" for d in docs])

    def search(self, query: str, k: int) -> list[tuple[dict[str, str], float]]:
        (q,) = self.embed([query])
        scores = [sum(a * b for a, b in zip(q, v, strict=True)) for v in self.vectors]
        ranked = sorted(range(len(self.docs)), key=lambda i: -scores[i])
        return [(self.docs[i], scores[i]) for i in ranked[:k]]


@rg.function
def judge(s, question, passage):
    s += JUDGE_SHOTS
    s += f"Question: {question}\nPassage: {passage}\nRelevant: "
    s += rg.select("relevant", choices=["yes", "no"])


def rerank(question: str, docs: Sequence[dict[str, str]]) -> list[tuple[dict[str, str], float]]:
    """Candidates by the model's p(yes) against p(no), best first."""
    states = judge.run_batch([{"question": question, "passage": d["text"]} for d in docs])
    scored = []
    for doc, state in zip(docs, states, strict=True):
        yes, no = state.get_meta_info("relevant")["normalized_prompt_logprobs"]
        scored.append((doc, 1.0 / (1.0 + math.exp(no - yes))))
    return sorted(scored, key=lambda pair: -pair[1])


@rg.function
def answer(s, question, passages):
    s += ANSWER_SHOTS + "Passages:\n"
    for i, passage in enumerate(passages, 1):
        s += f"[{i}] {passage}\n"
    s += "Question: " + question + "\nAnswer:"
    s += rg.gen("answer", max_tokens=32, stop=["\n", "Source:"], temperature=0)
    s += " Source: ["
    s += rg.select("source", choices=[str(i) for i in range(1, len(passages) + 1)])
    s += "]"


def ask(question: str, index: VectorIndex, k: int = 4, keep: int = 3) -> dict[str, Any]:
    retrieved = index.search(question, k)
    reranked = rerank(question, [doc for doc, _ in retrieved])[:keep]
    passages = [doc["text"] for doc, _ in reranked]
    state = answer.run(question=question, passages=passages)
    cited = reranked[int(state["source"]) - 1][0]
    return {"answer": state["answer"].strip(), "cited": cited["id"],
            "retrieved": [(d["id"], round(s, 3)) for d, s in retrieved],
            "reranked": [(d["id"], round(s, 3)) for d, s in reranked]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="Which planet is the hottest?")
    add_backend_args(parser)
    parser.add_argument("--embed-url", default="http://127.0.0.1:30001", help="embedding server")
    parser.add_argument("--embed-engine", action="store_true", help="embed in-process instead")
    parser.add_argument("--k", type=int, default=4, help="passages retrieved, then reranked")
    args = parser.parse_args()
    connect(args)
    if args.embed_engine:
        embed = engine_embedder(rg.Engine(is_embedding=True))
    else:
        embed = server_embedder(args.embed_url)
    result = ask(args.question, VectorIndex(load_corpus(), embed), k=args.k)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
