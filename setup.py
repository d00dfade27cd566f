"""Map the product's fixed top-level folders onto one import package, `radixgen`.

python/radixgen -> radixgen, frontend_lang -> radixgen.lang, runtime -> radixgen.runtime,
kernels -> radixgen.kernels. Subpackages are discovered, never listed by hand.
"""

from setuptools import find_packages, setup

ROOTS = {
    "radixgen": "python/radixgen",
    "radixgen.lang": "frontend_lang",
    "radixgen.runtime": "runtime",
    "radixgen.kernels": "kernels",
}


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
    package_data={"radixgen.kernels.cpu": ["*.c", "*.h"]},
    include_package_data=True,
)
