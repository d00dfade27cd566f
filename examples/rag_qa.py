"""Few-shot retrieval-augmented QA: BM25 over a local corpus, then an answer with a citation.

The answer is free text; the cited source is picked with `select` among the retrieved ids.
    python examples/rag_qa.py "Which planet is the hottest?" --url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from pathlib import Path

from common import add_backend_args, connect

import radixgen as rg

CORPUS = Path(__file__).parent / "data" / "corpus.jsonl"
SHOT = (
    "Documents:\n[1] The Nile is the longest river in Africa.\n[2] Rice is a staple food in Asia.\n"
    "Question: Which is the longest river in Africa?\nAnswer: The Nile. Source: [1]\n\n"
)


def tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class BM25:
    """Okapi BM25 (k1=1.5, b=0.75): a plain lexical scorer, enough for a small corpus."""

    def __init__(self, docs: list[dict], k1: float = 1.5, b: float = 0.75) -> None:
        self.docs, self.k1, self.b = docs, k1, b
        self.terms = [Counter(tokenize(d["title"] + " " + d["text"])) for d in docs]
        self.avg_len = sum(sum(t.values()) for t in self.terms) / len(docs)
        df = Counter(word for t in self.terms for word in t)
        self.idf = {w: math.log(1 + (len(docs) - n + 0.5) / (n + 0.5)) for w, n in df.items()}

    def search(self, query: str, k: int = 3) -> list[dict]:
        def score(terms: Counter) -> float:
            length = sum(terms.values())
            total = 0.0
            for word in tokenize(query):
                tf = terms.get(word, 0)
                norm = tf + self.k1 * (1 - self.b + self.b * length / self.avg_len)
                total += self.idf.get(word, 0.0) * tf * (self.k1 + 1) / norm
            return total

        ranked = sorted(range(len(self.docs)), key=lambda i: -score(self.terms[i]))
        return [self.docs[i] for i in ranked[:k]]


def load_corpus(path: Path = CORPUS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@rg.function
def rag_answer(s, question, documents):
    s += "Answer the question from the documents and cite the source.\n\n" + SHOT
    s += "Documents:\n"
    for i, doc in enumerate(documents, 1):
        s += f"[{i}] {doc['text']}\n"
    s += "Question: " + question + "\nAnswer:"
    s += rg.gen("answer", max_tokens=32, stop=["\n", "Source:"], temperature=0)
    s += " Source: ["
    s += rg.select("source", choices=[str(i) for i in range(1, len(documents) + 1)])
    s += "]"


def ask(question: str, index: BM25, k: int = 3) -> dict:
    documents = index.search(question, k)
    state = rag_answer.run(question=question, documents=documents)
    cited = documents[int(state["source"]) - 1]
    return {"answer": state["answer"].strip(), "source": state["source"], "cited": cited["id"],
            "retrieved": [d["id"] for d in documents]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="Which planet is the hottest?")
    add_backend_args(parser)
    args = parser.parse_args()
    connect(args)
    result = ask(args.question, BM25(load_corpus()))
    print(f"{result['answer']} [{result['source']}] (from {result['cited']})")


if __name__ == "__main__":
    main()
