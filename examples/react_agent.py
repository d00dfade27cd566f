"""A ReAct-style agent: think, pick a tool with `select`, run it in Python, observe, repeat.

The tool name is chosen among the registered tools by likelihood, so it is always valid.
    python examples/react_agent.py "What is 17 * 23?" --url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse
import ast
import operator

from common import add_backend_args, connect

import radixgen as rg

FACTS = {
    "eiffel tower": "The Eiffel Tower is 330 metres tall and stands in Paris.",
    "mount everest": "Mount Everest is 8849 metres high.",
    "python": "Python is a programming language created by Guido van Rossum.",
}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}  # fmt: skip


def calculator(expression: str) -> str:
    """Evaluate + - * / on numbers (no names, no calls)."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("not arithmetic")

    try:
        return str(ev(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError):
        return f"cannot compute {expression.strip()!r}"


def lookup(topic: str) -> str:
    topic = topic.strip().lower()
    hits = [fact for key, fact in FACTS.items() if key in topic or topic in key]
    return hits[0] if hits else f"no entry for {topic!r}"


TOOLS = {"calculator": calculator, "lookup": lookup}
PROMPT = """Answer the question using tools. Tools: calculator (arithmetic), lookup (facts), finish (give the answer).

Question: How tall is the Eiffel Tower?
Thought: I should look it up.
Action: lookup
Action Input: eiffel tower
Observation: The Eiffel Tower is 330 metres tall and stands in Paris.
Thought: I know the answer.
Action: finish
Action Input: 330 metres

"""


@rg.function
def react(s, question, max_steps=3):
    s += PROMPT + "Question: " + question + "\n"
    for step in range(max_steps):
        s += "Thought:" + rg.gen(f"thought_{step}", max_tokens=20, stop="\n", temperature=0) + "\n"
        s += "Action: " + rg.select(f"action_{step}", choices=[*TOOLS, "finish"]) + "\n"
        s += "Action Input:" + rg.gen(f"input_{step}", max_tokens=16, stop="\n", temperature=0)
        action = s[f"action_{step}"]
        if action == "finish":
            return s[f"input_{step}"].strip()
        s += "\nObservation: " + TOOLS[action](s[f"input_{step}"]) + "\n"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="What is 17 * 23?")
    add_backend_args(parser)
    args = parser.parse_args()
    connect(args)
    state = react.run(question=args.question)
    print(state.text()[len(PROMPT) :])
    print("answer:", state.ret_value)


if __name__ == "__main__":
    main()
