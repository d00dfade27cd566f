"""docs/design.md stays in step with the code: its code map lists every package folder, every
repository path it names exists, and it names every message class of the inter-process protocol.

Model-free and fast: it reads files only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from radixgen.package_layout import PACKAGE_ROOTS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "design.md"
# top-level entries of the repository a path named in the doc may start with
TOP_LEVEL = (
    "python/",
    "runtime/",
    "kernels/",
    "frontend_lang/",
    "examples/",
    "test/",
    "benchmark/",
    "docs/",
    "scripts/",
)
TOP_FILES = ("README.md", "pyproject.toml", "setup.py", "LICENSE")


def doc_text() -> str:
    return DOC.read_text()


def section(text: str, title: str) -> str:
    """The body of `## title`, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/design.md has no '## {title}' section"
    return match.group(1)


def package_folders() -> list[str]:
    """Every folder of the import package that holds an `__init__.py`, as `folder/`."""
    found = []
    for folder in PACKAGE_ROOTS.values():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.append(init.parent.relative_to(ROOT).as_posix() + "/")
    return sorted(found)


def named_paths(text: str) -> list[str]:
    """Repository paths the doc names in backticks (a `folder/` or a file)."""
    paths = []
    for token in re.findall(r"`([^`\s]+)`", text):
        if token.startswith(TOP_LEVEL) or token in TOP_FILES:
            paths.append(token)
    return paths


def message_classes() -> list[str]:
    tree = ast.parse((ROOT / "python" / "radixgen" / "io_struct.py").read_text())
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)]


def test_code_map_lists_every_package_folder() -> None:
    code_map = section(doc_text(), "Code map")
    listed = set(re.findall(r"^\| `([^`]+/)` \|", code_map, re.M))
    missing = [f for f in package_folders() if f not in listed]
    assert not missing, f"add these package folders to docs/design.md's code map: {missing}"
    gone = sorted(f for f in listed if not (ROOT / f / "__init__.py").is_file())
    assert not gone, f"docs/design.md's code map lists folders that are no packages: {gone}"


def test_every_named_path_exists() -> None:
    paths = named_paths(doc_text())
    assert len(paths) > 20, "the path scan found too little: has the doc's style changed?"
    missing = sorted({p for p in paths if not (ROOT / p).exists()})
    assert not missing, f"docs/design.md names paths that do not exist: {missing}"


def test_every_message_class_is_named() -> None:
    text = doc_text()
    missing = [name for name in message_classes() if f"`{name}`" not in text]
    assert not missing, f"docs/design.md does not name these io_struct messages: {missing}"


def test_readme_points_to_the_design_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/design.md" in readme


def test_scanners_see_what_they_should(tmp_path: Path) -> None:
    text = (
        "| `runtime/request_side/` | x |\nsee `runtime/nowhere.py` and `ServerArgs`, not `a/b`.\n"
    )
    assert named_paths(text) == ["runtime/request_side/", "runtime/nowhere.py"]
    assert "runtime/scheduler/" in package_folders()
    assert "TokenizedGenerateReq" in message_classes()
