"""Extract a JSON record from every text file of a folder into a JSONL file (a small batch job).

Decoding is constrained by the pydantic model's JSON schema, so every line is valid JSON.
    python examples/json_extract.py examples/data/people people.jsonl --url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import add_backend_args, connect
from pydantic import BaseModel, Field

import radixgen as rg


class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=130)
    city: str = Field(max_length=40)


@rg.function
def extract_person(s, text):
    s += rg.system("You extract facts from text as JSON.")
    s += rg.user("Who is described here? Give name, age and city.\n\nText: " + text)
    s += rg.assistant(rg.gen("person", max_tokens=64, temperature=0, json_schema=Person))


def extract_folder(folder: Path, output: Path, progress: bool = True) -> list[dict]:
    """One JSONL line per .txt file: {"file", "person"} or {"file", "error"}."""
    files = sorted(folder.glob("*.txt"))
    states = extract_person.run_batch(
        [{"text": f.read_text().strip()} for f in files], progress_bar=progress
    )
    records = []
    for path, state in zip(files, states, strict=True):
        try:
            records.append({"file": path.name, "person": state.parsed("person").model_dump()})
        except Exception as e:  # a failed or cut-off generation stays visible in the output
            records.append({"file": path.name, "error": str(e)})
    with output.open("w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="folder of .txt files")
    parser.add_argument("output", type=Path, help="JSONL file to write")
    add_backend_args(parser)
    args = parser.parse_args()
    connect(args)
    records = extract_folder(args.folder, args.output)
    print(f"wrote {len(records)} records to {args.output}")


if __name__ == "__main__":
    main()
