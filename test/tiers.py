"""Test tiers: `slow` is every test that starts an Engine or a server (real model, real processes,
HTTP); `pytest -m "not slow"` is the fast tier of components on their own."""

from __future__ import annotations

from pathlib import Path

import pytest


def mark_fixture_users_slow(items: list[pytest.Item], folder: Path, fixtures: set[str]) -> None:
    """Mark `slow` the tests under `folder` that use (directly or through other fixtures) one of
    `fixtures`: the ones that start processes."""
    for item in items:
        if item.path.is_relative_to(folder) and fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
