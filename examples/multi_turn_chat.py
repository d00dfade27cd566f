"""Multi-turn chat: each user turn and model answer is rendered with the model's chat template.

python examples/multi_turn_chat.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse

from common import add_backend_args, connect

import radixgen as rg

TURNS = [
    "Hi! Can you suggest a fruit for breakfast?",
    "Why is it a good choice?",
    "Thanks. Say goodbye in three words.",
]


@rg.function
def chat(s, turns):
    s += rg.system("You are a friendly, concise assistant.")
    for i, turn in enumerate(turns):
        s += rg.user(turn)
        with s.assistant():
            s += rg.gen(f"answer_{i}", max_tokens=24, temperature=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_backend_args(parser)
    connect(parser.parse_args())
    state = chat.run(turns=TURNS)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']}")


if __name__ == "__main__":
    main()
