"""Tree of thought (branch, solve, merge): fork ideas level by level, pick the best, answer.

Each level forks every branch `width` ways; `join()` gathers the branches' variables into
lists, so `s["thought_1"]` holds the first level's ideas and `s["thought_2"]` a list per idea.
    python examples/tree_of_thought.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse

from common import add_backend_args, connect

import radixgen as rg


def explore(s, depth: int, width: int) -> None:
    """Breadth first: every node of a level forks before any join, so a level's gens run
    together; joins go deepest first so each parent gathers its children's lists."""
    frontier, groups = [s], []
    for level in range(1, depth + 1):
        next_frontier = []
        for node in frontier:
            branches = node.fork(width)
            branches += lambda i, level=level: (
                f"Idea {level}.{i + 1}:"
                + rg.gen(f"thought_{level}", max_tokens=16, stop="\n", temperature=0.8)
                + "\n"
            )
            groups.append(branches)
            next_frontier.extend(branches)
        frontier = next_frontier
    for branches in reversed(groups):
        branches.join()


@rg.function
def tree_of_thought(s, question, depth=2, width=3):
    s += rg.user("Propose short ideas, one per line, then pick the best.\nProblem: " + question)
    s += rg.assistant_begin()
    explore(s, depth, width)
    ideas = s["thought_1"]
    s += "Ideas:\n" + "".join(f"{i + 1}. {idea.strip()}\n" for i, idea in enumerate(ideas))
    s += "The most useful idea is number "
    s += rg.select("best", choices=[str(i + 1) for i in range(len(ideas))])
    s += ".\nFinal answer:" + rg.gen("answer", max_tokens=24, stop="\n", temperature=0)
    s += rg.assistant_end()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", default="How can a small town reduce traffic jams?")
    add_backend_args(parser)
    args = parser.parse_args()
    connect(args)
    state = tree_of_thought.run(question=args.question)
    for i, idea in enumerate(state["thought_1"], 1):
        print(f"idea {i}: {idea.strip()}")
    print(f"best: {state['best']}; answer: {state['answer'].strip()}")


if __name__ == "__main__":
    main()
