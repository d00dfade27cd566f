"""Few-shot question answering: a constant five-shot prefix and one question per program.

`run_batch` traces the program, finds that prefix and prefills it once, so every question of
the batch reuses its KV cache.   python examples/few_shot_qa.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse

from common import add_backend_args, connect

import radixgen as rg

SHOTS = [
    ("What is the capital of France?", "Paris"),
    ("How many legs does a spider have?", "Eight"),
    ("What colour is a ripe banana?", "Yellow"),
    ("Which planet is closest to the Sun?", "Mercury"),
    ("What do bees make?", "Honey"),
]
QUESTIONS = [
    "What is the capital of Italy?",
    "How many days are in a week?",
    "What colour is the sky on a clear day?",
    "What animal says moo?",
]


@rg.function
def few_shot_qa(s, question):
    s += "Answer each question in one or two words.\n\n"
    for q, a in SHOTS:
        s += f"Question: {q}\nAnswer: {a}\n\n"
    s += "Question: " + question + "\nAnswer:"
    s += rg.gen("answer", max_tokens=8, stop="\n", temperature=0)


def answer_all(questions: list[str]) -> list[str]:
    states = few_shot_qa.run_batch([{"question": q} for q in questions], progress_bar=True)
    return [state["answer"].strip() for state in states]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_backend_args(parser)
    connect(parser.parse_args())
    for question, answer in zip(QUESTIONS, answer_all(QUESTIONS), strict=True):
        print(f"{question} -> {answer}")


if __name__ == "__main__":
    main()
