"""Keep benchmark/RESULTS.md as one section per benchmark, each replaced by its latest run."""

from __future__ import annotations

import re
from pathlib import Path

HEADER = "# Benchmark results\n\nFigures measured on this project's CI machine kind (2 cores, no GPU); machines are noisy, so\neach benchmark compares against a baseline measured in the same run and reports ratios.\n"


def replace_section(path: str | Path, title: str, body: str) -> None:
    """Write `## title` + body into the file, replacing an older section of the same title."""
    p = Path(path)
    text = p.read_text() if p.exists() else HEADER
    section = f"## {title}\n\n{body.rstrip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip() + "\n\n" + section
    p.write_text(text.rstrip() + "\n")
