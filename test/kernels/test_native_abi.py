"""The ctypes table in kernels/cpu/bindings.py matches radixgen_kernels.h, prototype by prototype.

A wrong argtype is silent in ctypes (an int64 read as an int, a float passed as a double), so the
header, which the compiler checks every definition against, is the reference for the bindings.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from radixgen.kernels.cpu import bindings, build, load_native_kernels

HEADER = build.SOURCE_DIR / "radixgen_kernels.h"
SCALARS: dict[str, type | None] = {
    "int64_t": ctypes.c_int64,
    "int": ctypes.c_int,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "void": None,
}


def _ctype(decl: str) -> type | None:
    """The ctypes type a C type maps to: pointers -> c_void_p, scalars by SCALARS."""
    if "*" in decl:
        return ctypes.c_void_p
    words = [w for w in decl.split() if w != "const"]
    assert len(words) == 1 and words[0] in SCALARS, f"no ctypes mapping for C type {decl!r}"
    return SCALARS[words[0]]


def header_prototypes() -> dict[str, tuple[type | None, tuple[type | None, ...]]]:
    """name -> (restype, argtypes) of every prototype in the header."""
    text = re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)
    text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)
    found: dict[str, tuple[type | None, tuple[type | None, ...]]] = {}
    for decl in (" ".join(d.split()) for d in text.split(";")):
        if not decl:
            continue
        m = re.fullmatch(r"(.+?)\s*\b(\w+)\s*\((.*)\)", decl)
        assert m, f"not a prototype: {decl!r}"
        ret, name, params = m.groups()
        args: list[type | None] = []
        if params.strip() != "void":
            for param in params.split(","):
                p = re.fullmatch(r"(.*?[\s*])(\w+)", param.strip())
                assert p, f"{name}: unnamed parameter {param!r}"
                args.append(_ctype(p.group(1)))
        assert name not in found, f"{name} is declared twice"
        found[name] = (_ctype(ret), tuple(args))
    return found


def test_header_parses_into_every_kernel() -> None:
    protos = header_prototypes()
    assert protos["gemm_bf16_available"] == (ctypes.c_int, ())
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    assert protos["silu_mul"] == (None, (p, p, i64, i64, i32, i32))


def test_every_prototype_is_bound_and_every_binding_declared() -> None:
    protos = header_prototypes()
    assert set(bindings.SIGNATURES) == set(protos)


@pytest.mark.parametrize("name", sorted(bindings.SIGNATURES))
def test_binding_types_match_the_prototype(name: str) -> None:
    restype, argtypes = bindings.SIGNATURES[name]
    want_res, want_args = header_prototypes()[name]
    assert restype is want_res, f"{name}: restype {restype} != {want_res}"
    assert len(argtypes) == len(want_args), f"{name}: {len(argtypes)} args != {len(want_args)}"
    for i, (got, want) in enumerate(zip(argtypes, want_args, strict=True)):
        assert got is want, f"{name} argument {i}: {got} != {want}"


def test_the_library_exports_exactly_the_header() -> None:
    """No exported function escapes the header (helpers stay `static`)."""
    kernels = load_native_kernels()
    if kernels is None or shutil.which("nm") is None:
        pytest.skip("no native library or no nm")
    cflags = build.variant_cflags(kernels.isa)
    lib_path = build.library_path(build.cache_key(build.find_compiler(), cflags), kernels.isa)
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib_path)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
    assert exported == set(header_prototypes())
