"""The benchmarks, examples and scripts import only names the package has.

They run outside the suite (by hand, on a GPU, in a benchmark session), so a rename in the
package breaks them silently: `bench_quant.py` and `bench_offline.py` once stopped at start-up on
a function moved to another module. Every `from radixgen... import name` in them, at module level
or inside a function, is resolved here against the installed package.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("benchmark", "examples", "scripts")
# modules that need a library a CPU machine does not install (checked where it is installed)
OPTIONAL = ("triton", "flashinfer")


def package_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, module, name) of every `from radixgen... import name` in FOLDERS."""
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                if module is None or node.level or not module.startswith("radixgen"):
                    continue
                assert isinstance(node, ast.ImportFrom)
                rel = str(path.relative_to(ROOT))
                found += [(rel, node.lineno, module, alias.name) for alias in node.names]
    return found


def resolves(module: str, name: str) -> str | None:
    """None where `from module import name` works, else why not."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in OPTIONAL:
            return None
        return f"{module} does not import: {e}"
    if name == "*" or hasattr(mod, name):
        return None
    try:  # a submodule, imported by name
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return f"{module} has no {name}"
    return None


def test_the_scan_finds_the_imports() -> None:
    found = package_imports()
    files = {f for f, *_ in found}
    assert len(found) > 50 and any(f.startswith("benchmark/") for f in files)
    # a function-local import counts too (bench_offline's measure_limits imports one)
    assert ("benchmark/bench_offline.py", "cpu_has_bf16") in {(f, n) for f, _, _, n in found}
    assert resolves("radixgen.runtime.model_executor.model_runner", "cpu_has_bf16") is not None


def test_every_package_name_they_import_exists() -> None:
    broken = [
        f"{file}:{line}: {why}"
        for file, line, module, name in package_imports()
        if (why := resolves(module, name)) is not None
    ]
    assert not broken, "\n".join(broken)
