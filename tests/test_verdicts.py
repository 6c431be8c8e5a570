"""The statistics behind compare and the website's verdicts: t quantiles, interval coverage, the walk.

Noise is simulated at the size measured between fresh vLLM starts of the embedded model on the
2-core CPU default (coefficient of variation 5-7% per start; docs/decode.md), effects at the sizes
users lose (5-12%), each beside a case that must not be named.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from b70bench import decode, stats, verdicts

START_CV = 0.055  # per-start spread measured on the CPU default


def starts(rng: random.Random, n: int, level: float = 1.0, cv: float = START_CV) -> list[float]:
    return [level * 1e-3 * math.exp(rng.gauss(0.0, cv)) for _ in range(n)]


@pytest.mark.parametrize(("m", "n"), [(2, 3), (3, 3), (4, 2), (5, 4)])
def test_rank_sum_distribution_matches_enumeration(m, n):
    """P(U <= u) against counting every arrangement of m x's and n y's."""
    counts = [0] * (m * n + 1)
    for xs in itertools.combinations(range(m + n), m):
        ys = [p for p in range(m + n) if p not in xs]
        counts[sum(y < x for x in xs for y in ys)] += 1
    total = math.comb(m + n, m)
    expected = list(itertools.accumulate(c / total for c in counts))
    assert stats._rank_sum_cdf(m, n) == pytest.approx(expected)


def test_ratio_is_the_median_pairwise_ratio_and_its_interval_the_tabled_ranks():
    a = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0]
    b = [x * 1.1 for x in a]
    r = stats.ratio_interval(a, b)
    assert r.ratio == pytest.approx(1.1)
    # m = n = 6 at 95%: the tabled critical U is 5, so the interval is the 6th and 31st of the 36 ratios.
    ratios = sorted(y / x for x in a for y in b)
    assert (r.lo, r.hi) == pytest.approx((ratios[5], ratios[30]))
    assert stats.ratio_interval([1.0, 2.0], [1.0, 2.0]).hi == math.inf  # too few for 95%: no interval
    with pytest.raises(ValueError):
        stats.ratio_interval([1.0], [1.0, 2.0])


def test_one_interfered_start_does_not_hide_a_slowdown():
    """A start that another process took (15x slower) moves a mean by any amount, the ranks barely."""
    a = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0]
    b = [1.1, 1.11, 1.09, 1.12, 1.08, 15.0]
    assert stats.ratio_interval(a, b).verdict() == stats.SLOWER
    assert stats.ratio_interval(a, a[:5] + [15.0]).verdict() == stats.NO_DIFFERENCE


def test_ratio_interval_covers_at_its_level():
    rng = random.Random(1)
    trials = 3000
    hits = 0
    for _ in range(trials):
        r = stats.ratio_interval(starts(rng, 6), starts(rng, 6, 1.05))
        hits += r.lo <= 1.05 <= r.hi
    # Discrete for six a side: the interval's exact coverage is 1 - 2 P(U <= 5) = 95.9%.
    assert 0.945 <= hits / trials <= 0.975


def test_verdict_words_and_min_effect():
    slow = stats.Ratio(1.08, 1.03, 1.13, 0.95, 6, 6)
    assert slow.verdict() == stats.SLOWER
    assert slow.verdict(min_effect=0.10) == stats.NO_DIFFERENCE  # resolved, but smaller than asked for
    assert stats.Ratio(0.9, 0.85, 0.95, 0.95, 6, 6).verdict() == stats.FASTER
    assert stats.Ratio(1.02, 0.98, 1.06, 0.95, 6, 6).verdict() == stats.NO_DIFFERENCE


def history(rng, effects: list[float], n: int) -> list[verdicts.Point]:
    level, points = 1.0, []
    for i, e in enumerate(effects):
        level *= 1.0 + e
        points.append(verdicts.Point(i, f"c{i}", tuple(starts(rng, n, level))))
    return points


def test_walk_names_a_ten_percent_slowdown_at_the_newest_commit_and_no_noop():
    """Baseline, four commits that change nothing, then +10% as the newest commit (the CI walk's history)."""
    rng = random.Random(7)
    named_newest, named_noop, trials = 0, 0, 300
    for _ in range(trials):
        out = verdicts.walk(history(rng, [0, 0, 0, 0, 0, 0.10], decode.DEFAULT_STARTS))
        assert [v.commit for v in out] == ["c1", "c2", "c3", "c4", "c5"]
        named_newest += out[-1].verdict == stats.SLOWER
        named_noop += sum(v.named for v in out[:-1])
    assert named_newest / trials >= 0.85
    assert named_noop / (4 * trials) <= 0.02


def test_walk_stays_quiet_over_noop_commits():
    rng = random.Random(11)
    trials = 300
    named = sum(v.named for _ in range(trials) for v in verdicts.walk(history(rng, [0] * 7, decode.DEFAULT_STARTS)))
    assert named / (6 * trials) <= 0.02


def test_walk_names_the_commit_a_slowdown_lands_and_not_the_ones_after():
    """A mid-history 15% slowdown starts a new segment: later unchanged commits are compared with it."""
    spread = (1.0, 1.03, 0.97, 1.01, 0.99, 1.02)
    levels = [1.0, 1.0, 1.0, 1.15, 1.15, 1.15]
    out = verdicts.walk([verdicts.Point(i, f"c{i}", tuple(x * lv for x in spread)) for i, lv in enumerate(levels)])
    assert [v.verdict for v in out] == [
        stats.NO_DIFFERENCE,
        stats.NO_DIFFERENCE,
        stats.SLOWER,
        stats.NO_DIFFERENCE,
        stats.NO_DIFFERENCE,
    ]
    assert out[2].reference == ["c0", "c1", "c2"] and out[3].reference == ["c3"]
    assert out[2].ratio.ratio == pytest.approx(1.15)


def test_walk_skips_commits_without_enough_samples():
    spread = (1.0, 1.03, 0.97, 1.01, 0.99, 1.02)
    points = [
        verdicts.Point(0, "a", spread),
        verdicts.Point(1, "b", (1.0,)),
        verdicts.Point(2, "c", tuple(1.2 * x for x in spread)),
    ]
    out = verdicts.walk(points)
    assert [(v.commit, v.verdict) for v in out] == [("b", verdicts.TOO_FEW), ("c", stats.SLOWER)]
    assert out[1].reference == ["a"]
