"""Summaries of paired A/B measurements (allreduce A/B rounds, decode suite vs vLLM latency pairs)."""

from __future__ import annotations

import math


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of a plain list, q in [0, 1]."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free interval for the median: order statistics k..n+1-k with binomial
    coverage >= level (no assumption about the noise's shape, which on a shared host is skewed).
    None when there are too few values for that coverage (n < 6 at 95%)."""
    n = len(values)
    s = sorted(values)
    tail, k = 0.0, 0
    while True:  # grow k while P(Binom(n, 1/2) <= k) stays within the allowed tail
        p = tail + math.comb(n, k) / 2**n
        if p > (1 - level) / 2:
            break
        tail, k = p, k + 1
    return (s[k - 1], s[n - k]) if k >= 1 else None
