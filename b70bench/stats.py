"""Summaries of paired A/B measurements (allreduce A/B rounds, decode suite vs vLLM latency pairs)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist


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


def geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# Verdict words, as the CLI, the JSON and the website print them.
SLOWER, FASTER, NO_DIFFERENCE = "slower", "faster", "no difference"


@dataclass(frozen=True)
class Ratio:
    """B/A for a lower-is-better figure (seconds) and its interval."""

    ratio: float
    lo: float
    hi: float
    level: float
    n_a: int
    n_b: int

    def verdict(self, min_effect: float = 0.0) -> str:
        """slower / faster when the interval excludes 1 and the ratio is at least min_effect away from it."""
        if self.lo > 1.0 and self.ratio >= 1.0 + min_effect:
            return SLOWER
        if self.hi < 1.0 and self.ratio <= 1.0 / (1.0 + min_effect):
            return FASTER
        return NO_DIFFERENCE


def _rank_sum_cdf(m: int, n: int) -> list[float]:
    """P(U <= u) for u = 0..m*n, U the Mann-Whitney statistic of m and n untied samples (exact)."""
    # counts[j][u]: orderings of i x's and j y's with u (x, y) pairs in which y comes first, for the current i.
    counts = [[1] + [0] * (m * n) for _ in range(n + 1)]
    for _i in range(1, m + 1):
        new = [[0] * (m * n + 1) for _ in range(n + 1)]
        for j in range(n + 1):
            for u in range(m * n + 1):
                # The largest value is an x (j y's below it, each a pair) or a y.
                total = counts[j][u - j] if u >= j else 0
                total += new[j - 1][u] if j else 0
                new[j][u] = total
        counts = new
    freq = counts[n]
    total, run, out = sum(freq), 0, []
    for f in freq:
        run += f
        out.append(run / total)
    return out


def ratio_interval(a: list[float], b: list[float], level: float = 0.95) -> Ratio:
    """B/A for lower-is-better samples: the Hodges-Lehmann shift of the logs and its Mann-Whitney interval.

    Logs, because the noise of a shared host scales with the figure and the ratio is what a user
    reads. Ranks, because a shared host now and then hands one start to another process: one such
    start moves a mean and a variance by any amount, but only a few of the m*n pairwise differences
    this interval is read from. The interval is exact for m*n <= 600 and uses the normal
    approximation of U above; its coverage is at least `level` (it is discrete for few samples).
    Each side needs at least two positive samples.
    """
    m, n = len(a), len(b)
    if m < 2 or n < 2:
        raise ValueError(f"need at least two samples a side (have {m} and {n})")
    if min(a) <= 0 or min(b) <= 0:
        raise ValueError("samples must be positive (seconds)")
    diffs = sorted(math.log(y) - math.log(x) for x in a for y in b)
    mn, tail = m * n, (1.0 - level) / 2.0
    # c: the 1-based rank of the lower end, the largest c with P(U <= c - 1) <= tail; the interval
    # diffs[c - 1] .. diffs[mn - c] then covers with probability 1 - 2 P(U <= c - 1) >= level.
    if mn <= 600:
        cdf = _rank_sum_cdf(m, n)
        c = 0
        while c < mn and cdf[c] <= tail:
            c += 1
    else:
        z = NormalDist().inv_cdf(1.0 - tail)
        c = int(math.floor(mn / 2.0 - z * math.sqrt(mn * (m + n + 1) / 12.0)))
    c = min(c, (mn + 1) // 2)
    mid = quantile(diffs, 0.5)
    if c < 1:  # too few samples for this level: no finite interval
        return Ratio(math.exp(mid), 0.0, math.inf, level, m, n)
    return Ratio(math.exp(mid), math.exp(diffs[c - 1]), math.exp(diffs[mn - c]), level, m, n)
