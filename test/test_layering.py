"""Import layering: `radixgen` core (no torch) <- `radixgen.kernels` <- `radixgen.runtime`, and
`radixgen.lang` never loads the runtime at import time, so the DSL stays a light install.

Module-level imports are read with `ast` (statements under `if TYPE_CHECKING:`, in an
`if __name__ == "__main__":` block and inside functions do not count); the core's "no torch"
rule is also checked for real in a subprocess. The same scan fails on any import cycle among our
modules, on a package cycle not in KNOWN_PACKAGE_CYCLES, and on a function-local import between
our modules not in LOCAL_IMPORTS_ALLOWED (each with its reason).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
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


def _is_main_block(node: ast.If) -> bool:
    """`if __name__ == "__main__":`: runs only when the module is run as a script."""
    test = node.test
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


Import = ast.Import | ast.ImportFrom
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _load_time_imports(body: list[ast.stmt]) -> Iterator[Import]:
    """Import statements that run when the module loads (not under `if TYPE_CHECKING:`, not in
    an `if __name__ == "__main__":` block, not inside a function)."""
    for node in body:
        if isinstance(node, Import):
            yield node
        elif isinstance(node, ast.If):
            if not (_is_type_checking(node) or _is_main_block(node)):
                yield from _load_time_imports(node.body)
            yield from _load_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _load_time_imports(node.body)
            for handler in node.handlers:
                yield from _load_time_imports(handler.body)
            yield from _load_time_imports(node.orelse)
            yield from _load_time_imports(node.finalbody)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _load_time_imports(node.body)


def _function_local_imports(tree: ast.Module) -> Iterator[Import]:
    """Import statements inside functions (run when the function is called)."""
    for fn in ast.walk(tree):
        if isinstance(fn, FUNCTIONS):
            for node in ast.walk(fn):
                if isinstance(node, Import):
                    yield node


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imported(node: Import, package: str) -> list[tuple[str, list[str]]]:
    """(absolute module, the names taken from it) of one import statement."""
    if isinstance(node, ast.Import):
        return [(a.name, []) for a in node.names]
    if node.level:
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        mod = f"{base}.{node.module}" if node.module else base
    else:
        mod = node.module or ""
    return [(mod, [a.name for a in node.names])]


def top_level_imports(name: str, path: Path) -> set[str]:
    """Absolute names imported when the module loads (relative imports resolved): for
    `from m import x`, both `m` and `m.x`."""
    package = _package_of(name, path)
    found: set[str] = set()
    for node in _load_time_imports(ast.parse(path.read_text(), filename=str(path)).body):
        for mod, names in _imported(node, package):
            found.add(mod)
            found.update(f"{mod}.{n}" for n in names)
    return found


def own_modules() -> dict[str, Path]:
    """Every module of ours, by dotted name."""
    return {name: path for package in FOLDERS for name, path in modules(package)}


def _targets(node: Import, package: str, own: Mapping[str, Path]) -> set[str]:
    """The modules of ours one import statement loads: `from m import x` loads `m.x` when that
    is a module, else `m` (x is a name defined in it); anything else is not ours."""

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in own:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = set()
    for mod, names in _imported(node, package):
        for dotted in [f"{mod}.{n}" for n in names] or [mod]:
            target = resolve(dotted)
            if target is not None:
                found.add(target)
    return found


def import_graph(own: Mapping[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports when it loads."""
    own = own_modules() if own is None else own
    graph = {}
    for name, path in own.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = _package_of(name, path)
        targets = set()
        for node in _load_time_imports(tree.body):
            targets |= _targets(node, package, own)
        graph[name] = targets - {name}
    return graph


def local_imports(own: Mapping[str, Path] | None = None) -> dict[tuple[str, str], list[int]]:
    """(module, module of ours it imports inside a function) -> the lines that do."""
    own = own_modules() if own is None else own
    found: dict[tuple[str, str], list[int]] = {}
    for name, path in own.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = _package_of(name, path)
        for node in _function_local_imports(tree):
            for target in _targets(node, package, own) - {name}:
                found.setdefault((name, target), []).append(node.lineno)
    return found


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) through each strongly connected group of the graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for group in groups:  # the shortest way round from the group's first module, by BFS
        start = min(group)
        came_from: dict[str, str] = {}
        frontier = [start]
        while start not in came_from and frontier:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & group):
                    if w not in came_from:
                        came_from[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while True:
            path.append(came_from[path[-1]])
            if path[-1] == start:
                break
        cycles.append(path[::-1])
    return sorted(cycles)


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


def test_layers_sit_below_the_models() -> None:
    """runtime/layers (norms, rotary, attention, MLP, MoE, vocab) is the library the models are
    composed of: at module load it imports the core, the kernels and itself, never a model, the
    model runner or anything above them (types under TYPE_CHECKING do not count)."""
    allowed = ("radixgen.runtime.layers", "radixgen.kernels")
    bad = []
    for name, path in modules("radixgen.runtime"):
        if not (name == allowed[0] or name.startswith(allowed[0] + ".")):
            continue
        for imp in top_level_imports(name, path):
            if imp.startswith("radixgen.runtime") and not any(
                imp == a or imp.startswith(a + ".") for a in allowed
            ):
                bad.append(f"{path.relative_to(ROOT)} imports {imp}")
    assert not bad


def test_light_processes_do_not_load_the_model_stack() -> None:
    """The API process (request_side/, entrypoints/, dashboard/), the detokenizer, start-up code
    and the tokenizer import neither torch, the kernels nor the scheduler's side at module load."""
    forbidden = (
        "torch",
        "radixgen.kernels",
        "radixgen.runtime.scheduler",
        "radixgen.runtime.model_executor",
        "radixgen.runtime.mem_cache",
    )
    light = tuple(
        f"radixgen.runtime.{p}"
        for p in ("request_side", "entrypoints", "dashboard", "detokenizer", "launch", "text")
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


# --- import cycles and function-local imports --------------------------------------------------

_GPU = (
    "optional GPU library: the kernels/triton modules import triton at load time, which CPU "
    "installs lack; they load when a GPU path is chosen"
)
_CLI = (
    "start-up time of the CLI: `radixgen --help` and flag errors answer without loading the "
    "server stack, which loads for the subcommand that runs it"
)
_CHILD = (
    "a child process loads its own role only: the detokenizer never loads torch or the "
    "scheduler's stack"
)
_SCHEDULER = (
    "the scheduler process sets itself up (configure_child_process: parent watch, signals, "
    "logging) before torch and the model stack load, so a failure while loading them is "
    "logged, and building the scheduler's parts (model runner, cache, tokenizer, grammars) "
    "fails into the ready pipe's error report"
)
# (module, module of ours it imports inside a function) -> why that import is not at module level
LOCAL_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {
    ("radixgen.kernels.attention.triton_backend", "radixgen.kernels.triton.decode_attention"): _GPU,
    ("radixgen.kernels.attention.triton_backend", "radixgen.kernels.triton.extend_attention"): _GPU,
    ("radixgen.kernels.grammar_mask", "radixgen.kernels.triton.bitmask"): _GPU,
    ("radixgen.kernels.layer_ops", "radixgen.kernels.triton.fused_ops"): _GPU,
    ("radixgen.cli", "radixgen.runtime.entrypoints.engine"): _CLI,
    ("radixgen.cli", "radixgen.runtime.entrypoints.offline_batch"): _CLI,
    ("radixgen.cli", "radixgen.runtime.entrypoints.http_server"): _CLI,
    ("radixgen.cli", "radixgen.runtime.router.router_app"): _CLI,
    ("radixgen.launch_server", "radixgen.runtime.entrypoints.http_server"): _CLI,
    ("radixgen.lang.backend.engine", "radixgen.runtime.entrypoints.engine"): (
        "the DSL stays a light install (test_lang_does_not_import_the_runtime): the runtime "
        "loads when an Engine backend is made"
    ),
    ("radixgen.runtime.entrypoints.http_server", "radixgen.runtime.request_side.metrics"): (
        "start-up time of the HTTP process: prometheus_client (~70 ms) loads with "
        "--enable-metrics only"
    ),
    ("radixgen.runtime.launch.child_main", "radixgen.runtime.detokenizer.detokenizer_manager"): (
        _CHILD
    ),
    ("radixgen.runtime.launch.child_main", "radixgen.runtime.scheduler.scheduler_process"): _CHILD,
    ("radixgen.runtime.model_loader.resolve", "radixgen.runtime.model_loader.gguf_convert"): (
        "the HTTP process resolves model paths (launch/launcher.py): numpy and the GGUF "
        "converter load for a .gguf path only"
    ),
    (
        "radixgen.runtime.scheduler.scheduler_process",
        "radixgen.runtime.constrained.grammar_manager",
    ): (_SCHEDULER),
    (
        "radixgen.runtime.scheduler.scheduler_process",
        "radixgen.runtime.distributed.parallel_state",
    ): (_SCHEDULER),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.distributed.tp_worker"): (
        _SCHEDULER
    ),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.mem_cache.chunk_cache"): (
        _SCHEDULER
    ),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.mem_cache.radix_cache"): (
        _SCHEDULER
    ),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.mem_cache.hiradix_cache"): (
        _SCHEDULER
    ),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.mem_cache.host_tier"): (
        _SCHEDULER
    ),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.mem_cache.file_tier"): (
        _SCHEDULER
    ),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.mem_cache.host_codec"): (
        _SCHEDULER
    ),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.kernels.kv_quant"): (_SCHEDULER),
    (
        "radixgen.runtime.scheduler.scheduler_process",
        "radixgen.runtime.model_executor.model_runner",
    ): (_SCHEDULER),
    (
        "radixgen.runtime.scheduler.scheduler_process",
        "radixgen.runtime.model_executor.resolution",
    ): (_SCHEDULER),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.models.model_config"): (
        _SCHEDULER
    ),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.scheduler.scheduler"): (
        _SCHEDULER
    ),
    ("radixgen.runtime.scheduler.scheduler_process", "radixgen.runtime.text.tokenizer"): _SCHEDULER,
    (
        "radixgen.runtime.scheduler.scheduler_process",
        "radixgen.runtime.model_executor.embedding_runner",
    ): _SCHEDULER,
    (
        "radixgen.runtime.scheduler.scheduler_process",
        "radixgen.runtime.scheduler.embedding_scheduler",
    ): _SCHEDULER,
    (
        "radixgen.runtime.scheduler.scheduler_process",
        "radixgen.runtime.model_executor.decoder_embedding_runner",
    ): _SCHEDULER,
}


def test_no_import_cycles() -> None:
    """No cycle among our modules' load-time imports (imports under `if TYPE_CHECKING:`, in
    functions or in an `if __name__ == "__main__":` block do not count)."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_function_local_imports_are_listed() -> None:
    """An import of one of our modules inside a function hides a dependency (and, often, a
    cycle): each is in LOCAL_IMPORTS_ALLOWED with its reason, and the list holds no stale entry."""
    own = own_modules()
    found = local_imports(own)
    unlisted = sorted(
        f"{own[a].relative_to(ROOT)}:{line} imports {b} inside a function"
        for (a, b), lines in found.items()
        if (a, b) not in LOCAL_IMPORTS_ALLOWED
        for line in lines
    )
    assert not unlisted, (
        "import these at module level (breaking the cycle if one results), or add them to "
        "LOCAL_IMPORTS_ALLOWED with the reason:\n" + "\n".join(unlisted)
    )
    stale = sorted(f"{a} -> {b}" for a, b in LOCAL_IMPORTS_ALLOWED if (a, b) not in found)
    assert not stale, "LOCAL_IMPORTS_ALLOWED lists imports no module makes:\n" + "\n".join(stale)


def package_graph(graph: Mapping[str, set[str]], own: Mapping[str, Path]) -> dict[str, set[str]]:
    """Package -> the packages its modules import (a package's own modules are in it, its
    subpackages are not; an import between a package and one inside it is not an edge)."""

    def package(name: str) -> str:
        return name if own[name].name == "__init__.py" else name.rpartition(".")[0]

    packages: dict[str, set[str]] = {}
    for a, targets in graph.items():
        pa = package(a)
        packages.setdefault(pa, set())
        for b in targets:
            pb = package(b)
            if pa != pb and not pb.startswith(pa + ".") and not pa.startswith(pb + "."):
                packages[pa].add(pb)
    return packages


# package cycles not broken yet (the packages in it) -> why
KNOWN_PACKAGE_CYCLES: dict[frozenset[str], str] = {}


def test_no_package_cycles() -> None:
    """No cycle among our packages' load-time imports, except the known ones listed above."""
    own = own_modules()
    cycles = import_cycles(package_graph(import_graph(own), own))
    new = [c for c in cycles if frozenset(c) not in KNOWN_PACKAGE_CYCLES]
    assert not new, "package import cycles:\n" + "\n".join(" -> ".join(c) for c in new)
    gone = [sorted(k) for k in KNOWN_PACKAGE_CYCLES if k not in {frozenset(c) for c in cycles}]
    assert not gone, f"KNOWN_PACKAGE_CYCLES lists cycles that are gone: {gone}"


def test_cycle_and_local_import_scanners(tmp_path: Path) -> None:
    """The scanners behind the two tests above find a cycle and a function-local import (and
    skip TYPE_CHECKING and __main__ blocks), on a fake package."""
    pkg = tmp_path / "fake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from fake import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import c\n"
        "if TYPE_CHECKING:\n    from fake import d\n"
        "def f():\n    from fake.d import thing\n"
    )
    (pkg / "c.py").write_text("import fake.a\n")
    (pkg / "d.py").write_text("thing = 1\nif __name__ == '__main__':\n    from fake import a\n")
    own = {
        f"fake.{p.stem}" if p.stem != "__init__" else "fake": p for p in sorted(pkg.glob("*.py"))
    }
    graph = import_graph(own)
    assert graph["fake.b"] == {"fake.c"} and graph["fake.d"] == set()
    assert import_cycles(graph) == [["fake.a", "fake.b", "fake.c", "fake.a"]]
    assert local_imports(own) == {("fake.b", "fake.d"): [6]}
    sub = pkg / "sub"
    sub.mkdir()
    (sub / "__init__.py").write_text("from fake import d\n")
    (pkg / "d.py").write_text("from fake.sub import x\n")
    (sub / "x.py").write_text("from fake import a\n")
    own = {**own, "fake.sub": sub / "__init__.py", "fake.sub.x": sub / "x.py"}
    packages = package_graph(import_graph(own), own)
    assert packages == {"fake": set(), "fake.sub": set()}  # a package and one inside it
    (pkg / "e.py").write_text("from other import y\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "y.py").write_text("from fake import a\n")
    own = {**own, "fake.e": pkg / "e.py", "other": other / "__init__.py", "other.y": other / "y.py"}
    cycles = import_cycles(package_graph(import_graph(own), own))
    assert cycles == [["fake", "other", "fake"]]
