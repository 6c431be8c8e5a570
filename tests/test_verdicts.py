"""The statistics behind compare and the website's verdicts: the four words, t quantiles, interval coverage,
the paired rule and the walk.

Noise is simulated at the size measured between fresh vLLM starts of the embedded model on the
2-core CPU default (coefficient of variation 5-7% per start; docs/decode.md), effects at the sizes
users lose (5-12%), each beside a case that must not be named.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics

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
    # Not named either way; the interval reaches the interfered start, so it cannot rule out 5% (undecided).
    assert stats.ratio_interval(a, a[:5] + [15.0]).decide().word == stats.UNDECIDED


def test_ratio_interval_covers_at_its_level():
    rng = random.Random(1)
    trials = 3000
    hits = 0
    for _ in range(trials):
        r = stats.ratio_interval(starts(rng, 6), starts(rng, 6, 1.05))
        hits += r.lo <= 1.05 <= r.hi
    # Discrete for six a side: the interval's exact coverage is 1 - 2 P(U <= 5) = 95.9%.
    assert 0.945 <= hits / trials <= 0.975


def test_the_four_words_from_hand_made_intervals():
    slow = stats.Ratio(1.08, 1.03, 1.13, 0.95, 6, 6)
    assert slow.decide() == stats.Decision(stats.SLOWER, None, 0.05, 1.03, 1.13)
    assert slow.verdict() == "slower"
    assert stats.Ratio(0.9, 0.85, 0.95, 0.95, 6, 6).verdict() == "faster"
    # The interval lies within [1/1.031, 1.031]: a change beyond 3.1% is ruled out.
    same = stats.Ratio(1.005, 0.98, 1.031, 0.95, 6, 6).decide()
    assert same.word == stats.NO_CHANGE and same.bound == pytest.approx(0.031)
    assert same.text == "no change beyond 3.1%" and not same.named
    # The low end decides the bound when 1/lo is the wider side: 1/0.96 = 1.0417.
    low = stats.Ratio(0.99, 0.96, 1.02, 0.95, 6, 6).decide()
    assert low.word == stats.NO_CHANGE and low.bound == pytest.approx(1 / 0.96 - 1)
    assert low.text == "no change beyond 4.2%"
    # The same centre, twice as wide: a 5% change is still inside, so nothing is ruled out.
    wide = stats.Ratio(1.01, 0.97, 1.08, 0.95, 6, 6).decide()
    assert wide.word == stats.UNDECIDED and wide.bound is None
    assert wide.text == "undecided: [0.970, 1.080] still holds a 5% change"
    assert stats.Ratio(1.0, 0.94, 1.03, 0.95, 6, 6).decide().word == stats.UNDECIDED  # 1/0.94 = 6.4% below
    # Too few samples for the level: no finite interval, so undecided whatever the ratio.
    none = stats.Ratio(1.0, 0.0, math.inf, 0.99, 2, 2).decide()
    assert none.word == stats.UNDECIDED and "too few samples" in none.text


def test_floor_and_min_effect_are_separate_thresholds():
    slow = stats.Ratio(1.08, 1.03, 1.13, 0.95, 6, 6)
    # Resolved, but smaller than the floor asked for: not named; the interval still holds 13%.
    assert slow.decide(min_effect=0.12, floor=0.10).word == stats.UNDECIDED
    # The floor never exceeds the smallest change that matters: resolved above 5%, it is named.
    assert slow.decide(floor=0.10).word == stats.SLOWER
    assert slow.decide(min_effect=0.15, floor=0.10).text == "no change beyond 13.0%"
    # A resolved change below the floor with a narrow interval: within the bound, so "no change beyond".
    tiny = stats.Ratio(1.005, 1.002, 1.009, 0.95, 6, 6)
    assert tiny.decide().text == "no change beyond 0.9%"
    assert tiny.decide(floor=0.004).word == stats.SLOWER
    # The bound is checked against min_effect: 3.1% is "no change" at 5%, undecided at 2.5%.
    same = stats.Ratio(1.005, 0.98, 1.031, 0.95, 6, 6)
    assert same.decide(min_effect=0.025).text == "undecided: [0.980, 1.031] still holds a 2.5% change"


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.706),
        (0.975, 2, 4.303),
        (0.975, 3, 3.182),
        (0.975, 5, 2.571),
        (0.975, 10, 2.228),
        (0.975, 30, 2.042),
        (0.995, 5, 4.032),
        (0.995, 1, 63.657),
        (0.95, 4, 2.132),
    ],
)
def test_t_quantiles_match_the_tables(p, df, expected):
    assert stats.t_quantile(p, df) == pytest.approx(expected, abs=1e-3)
    assert stats.t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-3)
    assert stats.t_cdf(stats.t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)


def test_t_cdf_against_closed_forms_and_the_normal():
    for t in (-3.0, -0.5, 0.0, 0.7, 2.0, 10.0):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi)  # Cauchy
        assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)))
    assert stats.t_quantile(0.975, 2000) == pytest.approx(1.961, abs=1e-3)  # near the normal's 1.960
    with pytest.raises(ValueError):
        stats.t_cdf(1.0, 0)


def test_paired_interval_is_the_t_interval_of_the_logs():
    ratios = [1.02, 0.99, 1.05, 1.01, 1.03]
    r = stats.paired_interval(ratios, 0.95)
    logs = [math.log(x) for x in ratios]
    mean = sum(logs) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 4)
    half = 2.7764451051977987 * sd / math.sqrt(5)  # t_0.975 with 4 degrees of freedom
    assert r.ratio == pytest.approx(math.exp(mean), rel=1e-12)
    assert (r.lo, r.hi) == pytest.approx((math.exp(mean - half), math.exp(mean + half)), rel=1e-9)
    assert (r.level, r.n_a, r.n_b) == (0.95, 5, 5)
    assert stats.paired_interval(ratios, 0.99).hi > r.hi  # wider at a higher level
    with pytest.raises(ValueError):
        stats.paired_interval([1.02])
    with pytest.raises(ValueError):
        stats.paired_interval([1.02, 0.0])


def test_trimmed_mean_drops_the_share_from_each_end():
    values = [5.0, -100.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 100.0]
    assert stats.trimmed_mean(values, 0.1) == pytest.approx(sum(range(1, 9)) / 8)  # one dropped each end
    assert stats.trimmed_mean(values, 0.0) == pytest.approx(sum(values) / 10)
    assert stats.trimmed_mean(values, 0.29) == pytest.approx(sum(range(2, 8)) / 6)  # floor(2.9) = 2 each end
    assert stats.trimmed_mean([2.0], 0.4) == 2.0


def test_paired_interval_covers_at_its_level():
    rng = random.Random(5)
    trials, hits = 2000, 0
    for _ in range(trials):
        r = stats.paired_interval([1.08 * math.exp(rng.gauss(0.0, 0.02)) for _ in range(6)], 0.95)
        hits += r.lo <= 1.08 <= r.hi
    assert 0.93 <= hits / trials <= 0.97


def test_winsorized_sd_pulls_the_ends_in():
    values = [5.0, -100.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 100.0]
    pulled = [5.0, 1.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 8.0]  # -100 -> 1, 100 -> 8 at 10%
    assert stats.winsorized_sd(values, 0.1) == pytest.approx(statistics.stdev(pulled), rel=1e-12)
    assert stats.winsorized_sd(values, 0.0) == pytest.approx(statistics.stdev(values), rel=1e-12)
    assert stats.lag1_correlation([1.0, -1.0] * 20) == pytest.approx(-1.0, abs=0.03)
    assert stats.lag1_correlation([3.0] * 5) == 0.0


def test_blocks_interval_is_the_random_effects_mean_with_its_floor():
    logs, ses = [0.05, 0.04, 0.06, 0.05], [0.02, 0.02, 0.04, 0.02]
    r = stats.blocks_interval(logs, ses, 0.95, offset_sd=0.015)
    # The blocks agree better than their rounds say: the spread between them is the floor.
    w = [1.0 / (s * s + 0.015**2) for s in ses]
    mean = sum(x * y for x, y in zip(w, logs, strict=True)) / sum(w)
    half = 1.959963984540054 * math.sqrt(1.0 / sum(w))
    assert r.ratio == pytest.approx(math.exp(mean), rel=1e-12)
    assert (r.lo, r.hi) == pytest.approx((math.exp(mean - half), math.exp(mean + half)), rel=1e-12)
    assert (r.level, r.n_a) == (0.95, 4)
    # Blocks that disagree far beyond their rounds: the spread between them is estimated, the interval wider.
    wide = stats.blocks_interval([0.10, -0.05, 0.12, -0.02], ses, 0.95, offset_sd=0.015)
    assert math.log(wide.hi / wide.lo) > 2 * math.log(r.hi / r.lo)
    with pytest.raises(ValueError):
        stats.blocks_interval([0.01], [0.02])
    with pytest.raises(ValueError):
        stats.blocks_interval([0.01, 0.02], [0.02, 0.0])


def test_blocks_interval_covers_at_its_level_and_beats_the_t_over_four_blocks():
    """Four blocks whose rounds give each a 2.6% standard error (96 rounds here) and a 1.2% offset between
    blocks (as measured on the VM): the interval holds the truth at least as often as it says; at the level of
    one of `compare`'s four looks it is about half as wide as the t interval over the four block values (3
    degrees of freedom)."""
    rng = random.Random(11)
    trials, hits, ratio_of_widths = 2000, 0, []
    for _ in range(trials):
        ses = [0.026 * math.exp(rng.gauss(0.0, 0.3)) for _ in range(4)]
        logs = [math.log(1.05) + rng.gauss(0.0, math.hypot(s, 0.012)) for s in ses]
        r = stats.blocks_interval(logs, ses, 0.95)
        hits += r.lo <= 1.05 <= r.hi
        look = stats.blocks_interval(logs, ses, 0.9875)
        t = stats.paired_interval([math.exp(x) for x in logs], 0.9875)
        ratio_of_widths.append(math.log(look.hi / look.lo) / math.log(t.hi / t.lo))
    assert hits / trials >= 0.94
    assert statistics.median(ratio_of_widths) < 0.6


def test_paired_verdicts_each_against_its_parent():
    rng = random.Random(3)
    blocks = lambda centre, n: tuple(centre * math.exp(rng.gauss(0.0, 0.02)) for _ in range(n))  # noqa: E731
    points = [
        verdicts.Point(2, "c2", blocks(1.10, 6), minutes=12.5, calls=40, parent="c1"),
        verdicts.Point(1, "c1", blocks(1.0, 12), parent="c0"),
        verdicts.Point(3, "c3", blocks(1.0, 2), parent="c2"),
        verdicts.Point(4, "c4", (1.01,), parent="c3"),
    ]
    out = verdicts.paired(points)
    assert [v.commit for v in out] == ["c1", "c2", "c3", "c4"]
    assert [v.verdict for v in out] == [stats.NO_CHANGE, stats.SLOWER, stats.UNDECIDED, stats.UNDECIDED]
    assert [v.reference for v in out] == [["c0"], ["c1"], ["c2"], ["c3"]]
    assert out[0].text.startswith("no change beyond ") and out[0].decision.bound <= verdicts.MIN_EFFECT
    assert [v.named for v in out] == [False, True, False, False]
    assert (out[1].n, out[1].minutes, out[1].calls, out[1].rule) == (6, 12.5, 40, verdicts.PAIRED)
    assert out[3].decision is None and "1 paired block" in out[3].text


def test_two_paired_blocks_with_their_standard_errors_decide_a_large_change():
    """The walk on a slow host fits two blocks: with their standard errors they name 1.32 (without, the t over
    two values stays undecided) and leave 1.01 unnamed."""
    big = verdicts.Point(1, "c1", (1.30, 1.34), parent="c0", ses=(0.02, 0.02))
    same = verdicts.Point(2, "c2", (1.02, 1.00), parent="c1", ses=(0.02, 0.02))
    bare = verdicts.Point(3, "c3", (1.30, 1.34), parent="c2")
    out = verdicts.paired([big, same, bare])
    assert [v.verdict for v in out] == [stats.SLOWER, stats.UNDECIDED, stats.UNDECIDED], [v.text for v in out]
    floor = math.hypot(0.02, stats.TWO_BLOCKS_OFFSET_SD) / math.sqrt(2)
    assert math.log(out[0].ratio.hi / out[0].ratio.lo) == pytest.approx(2 * 2.5758293035489 * floor, rel=1e-6)


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
        out = verdicts.unpaired(history(rng, [0, 0, 0, 0, 0, 0.10], decode.DEFAULT_STARTS))
        assert [v.commit for v in out] == ["c1", "c2", "c3", "c4", "c5"]
        named_newest += out[-1].verdict == stats.SLOWER
        named_noop += sum(v.named for v in out[:-1])
    assert named_newest / trials >= 0.85
    assert named_noop / (4 * trials) <= 0.02


def test_walk_stays_quiet_over_noop_commits():
    rng = random.Random(11)
    trials = 300
    named = sum(v.named for _ in range(trials) for v in verdicts.unpaired(history(rng, [0] * 7, decode.DEFAULT_STARTS)))
    assert named / (6 * trials) <= 0.02


def test_walk_names_the_commit_a_slowdown_lands_and_not_the_ones_after():
    """A mid-history 15% slowdown starts a new segment: later unchanged commits are compared with it."""
    spread = (1.0, 1.03, 0.97, 1.01, 0.99, 1.02)
    levels = [1.0, 1.0, 1.0, 1.15, 1.15, 1.15]
    out = verdicts.unpaired([verdicts.Point(i, f"c{i}", tuple(x * lv for x in spread)) for i, lv in enumerate(levels)])
    assert [v.text for v in out] == [
        "no change beyond 4.1%",
        "no change beyond 3.1%",
        "slower",
        "no change beyond 4.1%",
        "no change beyond 3.1%",
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
    out = verdicts.unpaired(points)
    assert [(v.commit, v.verdict) for v in out] == [("b", stats.UNDECIDED), ("c", stats.SLOWER)]
    assert out[0].decision is None and out[0].text == "undecided: 1 sample(s), an interval needs two"
    assert out[1].reference == ["a"]


@pytest.mark.parametrize(
    "ratios, ses",
    [
        ([1.06, 1.04, 1.07, 1.05], [0.01, 0.012, 0.011, 0.01]),  # together: each block's own standard error
        ([1.06, 1.04, 1.07, 1.05, 1.03, 1.08], [None] * 6),  # alternate: the blocks' spread alone
        ([1.01, 0.99, 1.0, 1.02], [0.01, 0.01, 0.012, 0.009]),
        ([1.2, 0.9, 1.1], [None] * 3),
    ],
)
def test_one_decision_for_the_stopping_rule_the_page_and_kernel_vs_model(ratios, ses):
    """The same blocks read by the stopping rule (paired.blocks.decide), the website (verdicts.paired) and
    kernel-vs-model give the same interval and the same verdict: one function decides."""
    from b70bench import kernel_vs_model
    from b70bench.paired import blocks as blockmod

    class Fixed(blockmod.Block):
        def __init__(self, r, se):
            super().__init__(0)
            self._r, self._se = r, se

        def ratio(self, normalise=False, key="latency_s"):
            return self._r

    fixed = [Fixed(r, s) for r, s in zip(ratios, ses, strict=True)]
    orig = blockmod.block_ses
    blockmod.block_ses = lambda bs, normalise=False, key="latency_s": [b._se for b in bs]
    try:
        r, stop = blockmod.decide(fixed, verdicts.LEVEL, stats.DEFAULT_MIN_EFFECT, stats.DEFAULT_FLOOR)
    finally:
        blockmod.block_ses = orig
    page = verdicts.paired([verdicts.Point(0, "c", tuple(ratios), ses=tuple(ses))])[0]
    kvm = kernel_vs_model._paired_change(1.0, ratios, ses, stats.DEFAULT_FLOOR, verdicts.LEVEL)
    assert (r.lo, r.hi) == (page.ratio.lo, page.ratio.hi) == tuple(kvm["interval"])
    assert stop.word == page.verdict == kvm["verdict"] and stop.text == page.text == kvm["text"]


def test_the_measurement_engine_imports_none_of_its_targets():
    """paired/ is the measurement engine; decode, serve and moe-down are its targets and compare its front: the
    engine never imports them (no circle), and nothing under stack/ imports a suite either."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "b70bench"
    targets = ("b70bench.decode", "b70bench.serve", "b70bench.moe", "b70bench.compare", "b70bench.cachekey")
    for pkg in ("paired", "stack"):
        for f in (root / pkg).glob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                bad = [n for n in names if n.startswith(targets)]
                assert not bad, f"{f.relative_to(root.parent)} imports {bad}"
