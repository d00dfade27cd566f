"""Run mypy on repository folders under their import names (CI, pre-commit, by hand).

setup.py maps folders onto one package (python/radixgen -> radixgen, runtime -> radixgen.runtime,
...), which mypy cannot express: it finds modules by directory layout, and the editable install's
import hook is invisible to it. So this builds a symlink tree of the package under
build/mypy/ (mypy_path in pyproject's [tool.mypy]), checks the given folders' modules by their
import names, and prints paths as they are in the repository.

    python scripts/typecheck.py                    # the folders in [tool.mypy] files
    python scripts/typecheck.py python/radixgen    # one area
    python scripts/typecheck.py kernels -- --no-incremental   # extra mypy flags after --
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
from pathlib import Path

from mypy import api

if sys.version_info >= (3, 11):
    import tomllib
else:  # mypy itself depends on tomli before 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "mypy"


def package_roots() -> dict[str, str]:
    """The folder map setup.py uses (import name -> folder), from python/radixgen/package_layout.py."""
    layout = runpy.run_path(str(ROOT / "python" / "radixgen" / "package_layout.py"))
    roots: dict[str, str] = layout["PACKAGE_ROOTS"]
    return roots


def build_tree(roots: dict[str, str]) -> None:
    """build/mypy/<package path> -> the folder it is mapped from (children linked one by one
    where a mapped folder sits inside another package's folder, e.g. radixgen/runtime)."""
    shutil.rmtree(TREE, ignore_errors=True)
    for name in sorted(roots, key=lambda n: n.count(".")):
        target = TREE.joinpath(*name.split("."))
        source = ROOT / roots[name]
        target.mkdir(parents=True, exist_ok=True)
        for child in sorted(source.iterdir()):
            if child.name != "__pycache__":
                (target / child.name).symlink_to(child)


def module_names(folder: Path, roots: dict[str, str]) -> list[str]:
    """Import names of every module under `folder` (a mapped folder or one inside it)."""
    folder = folder.resolve()
    best = max(
        (n for n in roots if folder.is_relative_to(ROOT / roots[n])),
        key=lambda n: len(roots[n]),
        default=None,
    )
    if best is None:
        raise SystemExit(f"{folder} is not inside a packaged folder ({sorted(roots.values())})")
    base = (ROOT / roots[best]).resolve()
    files = [folder] if folder.suffix == ".py" else sorted(folder.rglob("*.py"))
    names = []
    for path in files:
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        names.append(".".join([best, *parts]))
    return names


def repo_path(line: str, roots: dict[str, str]) -> str:
    """build/mypy/radixgen/runtime/x.py:3: ... -> runtime/x.py:3: ..."""
    for prefix in (f"{TREE}/", f"{TREE.relative_to(ROOT)}/"):
        if line.startswith(prefix):
            rest = line[len(prefix) :]
            break
    else:
        return line
    for name in sorted(roots, key=len, reverse=True):
        package = name.replace(".", "/") + "/"
        if rest.startswith(package):
            return roots[name] + "/" + rest[len(package) :]
    return line


def main(argv: list[str]) -> int:
    folders, extra = argv, []
    if "--" in argv:
        folders, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    os.chdir(ROOT)  # mypy prints paths relative to the working directory
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    roots = package_roots()
    build_tree(roots)
    modules = [m for f in folders or config["files"] for m in module_names(ROOT / f, roots)]
    args = ["--config-file", str(ROOT / "pyproject.toml"), *extra]
    for m in modules:
        args += ["-m", m]
    stdout, stderr, status = api.run(args)
    sys.stdout.write("".join(repo_path(ln, roots) for ln in stdout.splitlines(keepends=True)))
    sys.stderr.write(stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
