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


def trimmed_mean(values: list[float], proportion: float) -> float:
    """Mean of the values left after dropping floor(proportion * n) from each end of the sorted list."""
    s = sorted(values)
    k = int(proportion * len(s))
    kept = s[k : len(s) - k] or s
    return sum(kept) / len(kept)


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


# Verdict words, as the CLI, the JSON and the website print them. "no change" is printed with its bound
# ("no change beyond 3.1%"), "undecided" with the interval that still holds a change that matters.
SLOWER, FASTER, NO_CHANGE, UNDECIDED = "slower", "faster", "no change", "undecided"
# The smallest change that matters: an interval that still holds it is undecided, not "no change".
DEFAULT_MIN_EFFECT = 0.05
# The smallest ratio called slower / faster even when the interval excludes 1: separate processes of one build
# differ by ~2% on the CPU default, so a resolved change below that is not named (it reads "no change beyond").
DEFAULT_FLOOR = 0.02


def _pct(fraction: float) -> str:
    """0.05 -> "5%", 0.025 -> "2.5%" (min_effect as a user set it)."""
    return f"{round(fraction * 100, 6):g}%"


@dataclass(frozen=True)
class Decision:
    """One of the four verdicts for a ratio and what it rests on.

    bound: for NO_CHANGE, the largest change the interval still holds, as a fraction (max(hi, 1/lo) - 1);
    None for the other words. lo / hi: the interval the decision was read from (for the text)."""

    word: str
    bound: float | None
    min_effect: float
    lo: float = math.nan
    hi: float = math.nan

    @property
    def named(self) -> bool:
        return self.word in (SLOWER, FASTER)

    @property
    def text(self) -> str:
        if self.word == NO_CHANGE:
            return f"{NO_CHANGE} beyond {self.bound * 100:.1f}%"
        if self.word == UNDECIDED:
            if not (0.0 < self.lo and math.isfinite(self.hi)):
                return f"{UNDECIDED}: too few samples for an interval at this level"
            return f"{UNDECIDED}: [{self.lo:.3f}, {self.hi:.3f}] still holds a {_pct(self.min_effect)} change"
        return self.word


def beyond_floor(ratio: float, floor: float) -> str | None:
    """SLOWER where the ratio is at least 1 + floor, FASTER where it is at most 1 / (1 + floor), else None: the size
    half of the verdict rule (Ratio.decide adds the interval's half; a reading with one value a side has only this
    one, so it can name a change but never rule one out)."""
    if ratio >= 1.0 + floor:
        return SLOWER
    if ratio <= 1.0 / (1.0 + floor):
        return FASTER
    return None


@dataclass(frozen=True)
class Ratio:
    """B/A for a lower-is-better figure (seconds) and its interval."""

    ratio: float
    lo: float
    hi: float
    level: float
    n_a: int
    n_b: int

    def decide(self, min_effect: float = DEFAULT_MIN_EFFECT, floor: float = DEFAULT_FLOOR) -> Decision:
        """The four verdicts, first match wins:

        - slower: the interval's lower end above 1 and the ratio at least 1 + floor;
        - faster: the upper end below 1 and the ratio at most 1 / (1 + floor);
        - no change beyond X: the interval lies within [1 / (1 + X), 1 + X], X = max(hi, 1/lo) - 1 <= min_effect;
        - undecided: the interval still holds a change of min_effect (or has no finite ends: too few samples).

        The floor never exceeds min_effect: a change resolved above the smallest one that matters is named, or a
        2% setting would leave a resolved 1.5% change undecided however long it sampled.
        """
        size = beyond_floor(self.ratio, min(floor, min_effect))
        if size == SLOWER and self.lo > 1.0:
            return Decision(SLOWER, None, min_effect, self.lo, self.hi)
        if size == FASTER and self.hi < 1.0:
            return Decision(FASTER, None, min_effect, self.lo, self.hi)
        if self.lo > 0.0 and math.isfinite(self.hi):
            widest = max(self.hi, 1.0 / self.lo)
            if widest <= 1.0 + min_effect:
                return Decision(NO_CHANGE, widest - 1.0, min_effect, self.lo, self.hi)
        return Decision(UNDECIDED, None, min_effect, self.lo, self.hi)

    def verdict(self, min_effect: float = DEFAULT_MIN_EFFECT, floor: float = DEFAULT_FLOOR) -> str:
        """decide()'s printed text: "slower", "faster", "no change beyond 3.1%", "undecided: [...] still holds..."."""
        return self.decide(min_effect, floor).text


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with a whole number of degrees of freedom (df >= 1), exact.

    With theta = atan(t / sqrt(df)), P(|T| < t) is a finite sum in cos(theta) (Abramowitz and Stegun 26.7.3-4):
    odd df: (2/pi) (theta + sin cos (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ... up to c^(df-3)));
    even df: sin (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2))."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a whole number >= 1 (have {df})")
    if t == 0:
        return 0.5
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):  # terms c^2k with coefficient prod (2j) / (2j + 1), j = 1..k
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        inside = 2.0 / math.pi * (theta + s * math.cos(theta) * total)
    else:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):  # terms c^2k with coefficient prod (2j - 1) / (2j), j = 1..k
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = s * total
    inside = min(max(inside, 0.0), 1.0)
    return 0.5 + inside / 2.0 if t > 0 else 0.5 - inside / 2.0


def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p, by bisection on t_cdf (to about 1e-12 relative)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1) (have {p})")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2.0


def paired_interval(ratios: list[float], level: float = 0.95) -> Ratio:
    """B/A from paired ratios: each value one B/A of an independent block (B and A measured alternating in
    the same window), so host drift between blocks falls on both sides of each ratio and cancels.

    The geometric mean and a Student-t interval of the logs: exp(mean +- t * sd / sqrt(n)), t at
    (1 + level) / 2 with n - 1 degrees of freedom. n_a = n_b = n. Needs two or more positive ratios."""
    n = len(ratios)
    if n < 2:
        raise ValueError(f"need at least two paired ratios (have {n})")
    if min(ratios) <= 0:
        raise ValueError("paired ratios must be positive")
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile((1.0 + level) / 2.0, n - 1) * sd / math.sqrt(n)
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), level, n, n)


def winsorized_sd(values: list[float], proportion: float) -> float:
    """Standard deviation after pulling floor(proportion * n) values at each end in to the nearest kept one
    (Tukey and McLaughlin: with it, the trimmed mean's standard error is sd_w / ((1 - 2 * proportion) * sqrt(n)))."""
    s = sorted(values)
    n, k = len(s), int(proportion * len(s))
    if n < 2:
        raise ValueError(f"need at least two values (have {n})")
    lo, hi = s[k], s[n - 1 - k]
    w = [min(max(v, lo), hi) for v in values]
    mean = sum(w) / n
    return math.sqrt(sum((v - mean) ** 2 for v in w) / (n - 1))


def lag1_correlation(values: list[float]) -> float:
    """Lag-1 autocorrelation of a series (0.0 for a constant one)."""
    mean = sum(values) / len(values)
    d = [v - mean for v in values]
    den = sum(x * x for x in d)
    return sum(a * b for a, b in zip(d, d[1:], strict=False)) / den if den > 0 else 0.0


# The spread between paired blocks that their own rounds do not explain (each process's small speed offset
# for its whole life): 1.26% over 77 A/A blocks of `compare` on the 2-core VM (docs/timing.md); the floor
# blocks_interval puts under what a measurement's own blocks show.
BLOCK_OFFSET_SD = 0.015
# With two blocks their spread says next to nothing about it: the floor is then the widest offset seen between
# fresh pairs of identical engines (sd 1.7% over six pairs; the simulations in tests/test_pair.py use 2.1%).
TWO_BLOCKS_OFFSET_SD = 0.021


def decide_blocks(
    ratios: list[float | None],
    ses: list[float | None],
    level: float,
    min_effect: float = DEFAULT_MIN_EFFECT,
    floor: float = DEFAULT_FLOOR,
) -> tuple[Ratio | None, Decision | None]:
    """The one decision over paired blocks, read by the stopping rule (paired.blocks.decide), the website
    (verdicts.paired) and kernel-vs-model: (B/A with its interval, the verdict), or (None, None) with fewer than two
    blocks that carry a ratio. With every block's own standard error of its log ratio, blocks_interval; else (a
    block too short for one, or alternate blocks, whose rounds cannot see their starts' offset) the t interval over
    the block values (paired_interval). Then Ratio.decide."""
    if len(ses) != len(ratios):
        ses = [None] * len(ratios)
    kept = [(r, e) for r, e in zip(ratios, ses, strict=True) if r is not None and r > 0]
    if len(kept) < 2:
        return None, None
    good = [r for r, _e in kept]
    errors = [e for _r, e in kept]
    if all(e is not None and e > 0 for e in errors):
        ratio = blocks_interval([math.log(r) for r in good], errors, level)
    else:
        ratio = paired_interval(good, level)
    return ratio, ratio.decide(min_effect, floor)


def blocks_interval(
    logs: list[float], ses: list[float], level: float = 0.95, offset_sd: float = BLOCK_OFFSET_SD
) -> Ratio:
    """B/A from blocks of paired rounds, each block a log ratio with its own standard error (from its rounds).

    A random-effects mean (DerSimonian and Laird): each block weighs 1 / (se^2 + tau^2), tau^2 the spread
    between blocks beyond their rounds, estimated from the blocks and never below offset_sd^2; the interval
    is normal, exp(mean +- z * sqrt(1 / sum of weights)). A block's rounds (dozens) pin its standard error
    down, so four blocks give an interval the t over four block values (3 degrees of freedom) cannot. Two
    blocks take the floor at least TWO_BLOCKS_OFFSET_SD (the t over two values, 1 degree of freedom, would be
    25 times wider than z at 99%)."""
    k = len(logs)
    if k < 2 or len(ses) != k:
        raise ValueError(f"need two or more blocks, each with a standard error (have {k} and {len(ses)})")
    if min(ses) <= 0:
        raise ValueError("block standard errors must be positive")
    w = [1.0 / (s * s) for s in ses]
    sw = sum(w)
    fixed = sum(wi * y for wi, y in zip(w, logs, strict=True)) / sw
    q = sum(wi * (y - fixed) ** 2 for wi, y in zip(w, logs, strict=True))
    floor = offset_sd if k > 2 else max(offset_sd, TWO_BLOCKS_OFFSET_SD)
    tau2 = max((q - (k - 1)) / (sw - sum(x * x for x in w) / sw), floor**2)
    w = [1.0 / (s * s + tau2) for s in ses]
    mean = sum(wi * y for wi, y in zip(w, logs, strict=True)) / sum(w)
    half = NormalDist().inv_cdf((1.0 + level) / 2.0) * math.sqrt(1.0 / sum(w))
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), level, k, k)


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
