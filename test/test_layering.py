"""Import layering: `radixgen` core (no torch) <- `radixgen.kernels` <- `radixgen.runtime`, and
`radixgen.lang` never loads the runtime at import time, so the DSL stays a light install.

Module-level imports are read with `ast` (statements under `if TYPE_CHECKING:` and inside
functions do not count); the core's "no torch" rule is also checked for real in a subprocess.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixgen.package_layout import PACKAGE_ROOTS

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {name: ROOT / folder for name, folder in PACKAGE_ROOTS.items()}


def modules(package: str) -> Iterator[tuple[str, Path]]:
    """(dotted name, file) of every module of `package`'s own folder."""
    folder = FOLDERS[package]
    for path in sorted(folder.rglob("*.py")) if folder.exists() else []:
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join([package, *parts]), path


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def top_level_imports(name: str, path: Path) -> set[str]:
    """Absolute names imported when the module loads (relative imports resolved)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    mod = f"{base}.{node.module}" if node.module else base
                else:
                    mod = node.module or ""
                found.add(mod)
                found.update(f"{mod}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    return found


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for name, path in modules(package):
        for imp in top_level_imports(name, path):
            if any(imp == f or imp.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {imp}")
    return sorted(bad)


def test_core_imports_no_runtime_kernels_or_torch() -> None:
    forbidden = ("radixgen.runtime", "radixgen.kernels", "radixgen.lang", "torch")
    assert not _violations("radixgen", forbidden)


def test_lang_does_not_import_the_runtime() -> None:
    assert not _violations("radixgen.lang", ("radixgen.runtime", "radixgen.kernels", "torch"))


def test_kernels_do_not_import_the_runtime() -> None:
    assert not _violations("radixgen.kernels", ("radixgen.runtime", "radixgen.lang"))


def test_light_processes_do_not_load_the_model_stack() -> None:
    """The API process (api/, entrypoints/, dashboard/), the detokenizer, start-up code and the
    tokenizer import neither torch, the kernels nor the scheduler's side at module load."""
    forbidden = (
        "torch",
        "radixgen.kernels",
        "radixgen.runtime.scheduler",
        "radixgen.runtime.model_executor",
        "radixgen.runtime.mem_cache",
    )
    light = tuple(
        f"radixgen.runtime.{p}"
        for p in ("api", "entrypoints", "dashboard", "detokenizer", "launch", "text")
    )
    bad = []
    for name, path in modules("radixgen.runtime"):
        if name.startswith(light):
            bad.extend(
                f"{path.relative_to(ROOT)} imports {imp}"
                for imp in top_level_imports(name, path)
                if any(imp == f or imp.startswith(f + ".") for f in forbidden)
            )
    assert not bad


def test_scanner_sees_imports(tmp_path: Path) -> None:
    """The scanner catches what it must and skips what it may (guards the tests above)."""
    src = tmp_path / "mod.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "import torch.nn\n"
        "from ..runtime import engine\n"
        "try:\n    import numpy\nexcept ImportError:\n    pass\n"
        "if TYPE_CHECKING:\n    import radixgen.kernels\n"
        "def f():\n    import radixgen.runtime\n"
    )
    found = top_level_imports("radixgen.lang.mod", src)
    assert {"torch.nn", "radixgen.runtime", "radixgen.runtime.engine", "numpy"} <= found
    assert "radixgen.kernels" not in found


def _loaded_after_import(names: list[str]) -> dict[str, bool]:
    code = (
        "import importlib, json, sys\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        "print(json.dumps({k: k in sys.modules for k in "
        "('torch', 'numpy', 'radixgen.runtime', 'radixgen.kernels')}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_radixgen_loads_no_torch() -> None:
    loaded = _loaded_after_import(["radixgen"])
    assert not loaded["torch"] and not loaded["radixgen.runtime"] and not loaded["radixgen.kernels"]
    proc = subprocess.run(
        [sys.executable, "-c", "import radixgen; print(radixgen.__file__, radixgen.__version__)"],
        capture_output=True,
        text=True,
    )
    # a stale editable install makes `radixgen` a namespace package and this test vacuous
    assert proc.returncode == 0 and "python/radixgen/__init__.py" in proc.stdout, proc.stderr


@pytest.mark.parametrize("package", ["radixgen", "radixgen.lang"])
def test_light_modules_import_without_torch(package: str) -> None:
    """Every core (and DSL) module, imported for real, pulls in neither torch nor the runtime."""
    names = [n for n, _ in modules(package)]
    if not names:
        pytest.skip(f"{package} has no modules yet")
    loaded = _loaded_after_import(names)
    assert not loaded["torch"] and not loaded["radixgen.runtime"], loaded
