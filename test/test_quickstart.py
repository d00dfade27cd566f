"""The README's quick start and CI stay in step: CI runs the README's test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the quick start has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_two_commands_serve_then_test():
    serve, test = _quick_start_commands()
    assert "radixgen serve" in serve and "scripts/install.sh" in serve
    assert "pytest" in test and "scripts/install.sh test" in test


def test_ci_runs_the_readmes_test_command_verbatim():
    ci_lines = [
        ln
        for ln in (ROOT / ".ci" / "run").read_text().splitlines()
        if ln and not ln.startswith("#")
    ]
    assert ci_lines[-1] == _quick_start_commands()[1]
