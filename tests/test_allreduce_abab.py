"""The A/B script's summary (scripts/device/allreduce_abab.py): ratios, order split, the median's interval."""

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device" / "allreduce_abab.py"
spec = importlib.util.spec_from_file_location("allreduce_abab", SCRIPT)
abab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(abab)


def _coverage(n: int, k: int) -> float:
    """P(x(k) <= true median <= x(n+1-k)) for n draws of a continuous variable, 1-based order statistics."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n


@pytest.mark.parametrize("n", [5, 6, 9, 15, 25])
def test_median_ci_is_the_narrowest_order_statistic_pair_with_95_percent(n):
    values = [float(v) for v in range(100, 100 + n)][::-1]  # unsorted input on purpose
    ci = abab.median_ci(values)
    if n == 5:  # even min..max covers only 1 - 2/32 = 93.75%
        assert ci is None
        return
    k = int(ci[0]) - 100 + 1
    assert ci == (100.0 + k - 1, 100.0 + n - k)
    assert _coverage(n, k) >= 0.95 > _coverage(n, k + 1)


def test_summarize_per_round_ratio_order_split_and_skips():
    rounds = []
    for i, (a, b) in enumerate([(10, 10.2), (20, 21), (10, 9.9), (10, 10.4), (30, 29.7)]):
        rounds.append(
            dict(
                round=i,
                order="AB" if i % 2 == 0 else "BA",
                graph=False,
                size_bytes=8,
                mode="clone",
                a_us=a,
                b_us=b,
                skipped=None,
                wrong=0,
            )
        )
    rounds.append(
        dict(
            round=0,
            order="AB",
            graph=True,
            size_bytes=8,
            mode="clone",
            a_us=7.0,
            b_us=None,
            skipped="graph capture failed: X",
            wrong=None,
        )
    )
    eager, graph = abab.summarize(rounds)
    ratios = [1.02, 1.05, 0.99, 1.04, 0.99]
    assert eager["rounds"] == 5 and eager["ratio"] == pytest.approx(1.02)
    assert (eager["ratio_min"], eager["ratio_max"]) == pytest.approx((0.99, 1.05))
    assert eager["ratio_ab"] == pytest.approx(sorted([ratios[0], ratios[2], ratios[4]])[1])
    assert eager["ratio_ba"] == pytest.approx((ratios[1] + ratios[3]) / 2)
    assert eager["a_us"] == 10 and eager["b_us"] == pytest.approx(10.4) and eager["within_5pct"]
    # the per-round ratio, not the ratio of medians: a slow round moves A and B together
    assert eager["ratio"] != pytest.approx(eager["b_us"] / eager["a_us"])
    assert graph["rounds"] == 0 and graph["skipped"].startswith("graph capture failed") and "ratio" not in graph
    text = abab.table([eager, graph])
    assert "**1.020**" in text and "skipped: graph capture failed" in text
