"""The live dashboard (API process): the page's assets, the snapshot hub and the program traces;
its HTTP routes are `radixgen.runtime.entrypoints.dashboard_routes`."""

from pathlib import Path

STATIC = Path(__file__).parent / "static"  # the page, its script and style (package data)
