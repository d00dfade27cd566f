"""Map the product's fixed top-level folders onto one import package, `radixgen`.

The map itself lives in python/radixgen/package_layout.py (also read by the packaging and
layering tests). Subpackages are discovered, never listed by hand.
"""

import runpy
from pathlib import Path

from setuptools import find_packages, setup

# the one folder -> import-name map (python/radixgen/package_layout.py), read without importing
_LAYOUT = Path(__file__).parent / "python" / "radixgen" / "package_layout.py"
ROOTS: dict[str, str] = runpy.run_path(str(_LAYOUT))["PACKAGE_ROOTS"]


def discover() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for name, folder in ROOTS.items():
        packages.append(name)
        package_dir[name] = folder
        for sub in find_packages(folder):
            full = f"{name}.{sub}"
            packages.append(full)
            package_dir[full] = f"{folder}/{sub.replace('.', '/')}"
    return packages, package_dir


packages, package_dir = discover()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={
        "radixgen.kernels.cpu": ["*.c", "*.h"],
        "radixgen.runtime.dashboard": ["static/*.html", "static/*.js", "static/*.css"],
    },
    include_package_data=True,
)
