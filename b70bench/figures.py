"""One reading of what asv stored for a figure, for every reader of asv results (the website, kernel-vs-model).

asv keeps a figure that was not measured in several forms: None (a skip or failure), NaN (an adapter that
returns NaN for a figure its mode does not measure, as `make bench`'s one-commit mode does for the paired
figures), or no entry at all. All of them mean "not measured" and none may be read as a number."""

from __future__ import annotations

import math


def measured(value) -> float | None:
    """The figure as a float, or None where it was not measured (None, NaN, infinite, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def measured_samples(samples) -> tuple[float, ...] | None:
    """The measured samples of one figure (unmeasured ones dropped), or None where none was measured."""
    if not isinstance(samples, (list, tuple)):
        return None
    got = tuple(x for x in (measured(s) for s in samples) if x is not None)
    return got or None
