"""Order for `make test`'s parallel run: the slow tests first, so that no worker is left with a long one at the end
(pytest-xdist with --dist loadfile hands out files in collection order as workers free up)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order kept otherwise
