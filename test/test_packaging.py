"""The wheel holds every subpackage of the four mapped folders, the C kernel sources and the
dashboard's static assets.

setup.py discovers packages instead of listing them; this builds the wheel from a copy of the
source (so the working tree gets no build/ litter) and checks nothing was left behind.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from radixgen.package_layout import PACKAGE_ROOTS

ROOT = Path(__file__).resolve().parents[1]
# source folder -> its path inside the wheel: the product's fixed layout (docs/design.md's code map), written out
# here so that a change to package_layout.py (which setup.py reads) has to be a deliberate one
MAPPING = {
    "python/radixgen": "radixgen",
    "frontend_lang": "radixgen/lang",
    "runtime": "radixgen/runtime",
    "kernels": "radixgen/kernels",
}


def test_package_layout_is_the_products_layout() -> None:
    assert {f: n.replace(".", "/") for n, f in PACKAGE_ROOTS.items()} == MAPPING


_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build", "*.egg-info")


def _package_dirs(folder: Path) -> list[Path]:
    return sorted(p.parent for p in folder.rglob("__init__.py") if "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    for folder in MAPPING:
        if (ROOT / folder).exists():
            shutil.copytree(ROOT / folder, src / folder, ignore=_SKIP)
    out = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check"]
    proc = subprocess.run([*cmd, "--outdir", str(out), str(src)], capture_output=True, text=True)
    if proc.returncode != 0:  # `build` missing: pip builds the same wheel
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        proc = subprocess.run([*pip, "-w", str(out), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("radixgen-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


@pytest.mark.parametrize("folder", sorted(MAPPING))
def test_every_subpackage_is_in_the_wheel(wheel_names: set[str], folder: str) -> None:
    base = ROOT / folder
    missing = []
    for pkg in _package_dirs(base) if base.exists() else []:
        inner = MAPPING[folder] + ("/" + pkg.relative_to(base).as_posix() if pkg != base else "")
        for module in pkg.glob("*.py"):
            if f"{inner}/{module.name}" not in wheel_names:
                missing.append(f"{inner}/{module.name}")
    assert not missing, f"not in the wheel: {missing}"


def test_c_kernel_sources_are_in_the_wheel(wheel_names: set[str]) -> None:
    cpu = ROOT / "kernels" / "cpu"
    sources = sorted([*cpu.glob("*.c"), *cpu.glob("*.h")])
    assert sources, "kernels/cpu has no C sources"
    for c in sources:
        assert f"radixgen/kernels/cpu/{c.name}" in wheel_names


def test_dashboard_assets_are_in_the_wheel(wheel_names: set[str]) -> None:
    """The dashboard's page, script and style are served from the package (no CDN)."""
    static = ROOT / "runtime" / "dashboard" / "static"
    assets = sorted(p.name for p in static.iterdir() if p.suffix in {".html", ".js", ".css"})
    assert {"index.html", "dashboard.js", "dashboard.css"} <= set(assets)
    for name in assets:
        assert f"radixgen/runtime/dashboard/static/{name}" in wheel_names


def test_wheel_holds_only_radixgen(wheel_names: set[str]) -> None:
    """No test/, benchmark/ or stray top-level package; entry point and version are right."""
    tops = {n.split("/")[0] for n in wheel_names}
    (dist_info,) = [t for t in tops if t.endswith(".dist-info")]
    assert tops == {"radixgen", dist_info}
    version = re.search(
        r'__version__\s*=\s*"([^"]+)"', (ROOT / "python/radixgen/version.py").read_text()
    )
    assert version and dist_info == f"radixgen-{version.group(1)}.dist-info"


# imported when their module loads but needed only where the user opts in, each with its reason
OPTIONAL_IMPORTS = {
    "triton": "the GPU path's kernels (radixgen.kernels.triton loads only with a CUDA device)",
}


def _dist_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; (]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_every_package_imported_at_load_is_an_install_dependency() -> None:
    """A module-level import of a third-party package must be covered by pyproject's
    `dependencies` (or what they require): a test extra is not installed by the quick start's
    `install.sh` (jsonschema, imported by the scheduler, once was only in the test extra)."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, requires

    import tomllib
    from test_layering import own_modules, top_level_imports

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    covered = {_dist_name(d) for d in pyproject["project"]["dependencies"]}
    todo = list(covered)
    while todo:  # what the declared dependencies themselves require (their own, not extras)
        try:
            reqs = requires(todo.pop()) or []
        except PackageNotFoundError:
            continue
        for req in reqs:
            name = _dist_name(req)
            if "extra ==" not in req and name not in covered:
                covered.add(name)
                todo.append(name)
    dists = packages_distributions()
    missing = {}
    for module, path in own_modules().items():
        for imported in top_level_imports(module, path):
            top = imported.split(".")[0]
            if top in sys.stdlib_module_names or top in ("radixgen", "__future__"):
                continue
            names = {_dist_name(d) for d in dists.get(top, [top])}
            if not names & covered and top not in OPTIONAL_IMPORTS:
                missing.setdefault(top, module)
    assert not missing, f"imported at load but not an install dependency: {missing}"
