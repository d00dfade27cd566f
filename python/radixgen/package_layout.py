"""Where each part of the one import package `radixgen` lives in the repository.

The product's top-level folders are fixed, so setuptools maps them onto subpackages. This table is
the single source of that map: setup.py reads it (by path, before anything is installed), and the
packaging and layering tests and the type checker's link tree read it too.
"""

from __future__ import annotations

# import name -> folder, relative to the repository root
PACKAGE_ROOTS: dict[str, str] = {
    "radixgen": "python/radixgen",
    "radixgen.lang": "frontend_lang",
    "radixgen.runtime": "runtime",
    "radixgen.kernels": "kernels",
}
