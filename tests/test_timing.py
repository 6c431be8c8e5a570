import statistics
import time

import numpy as np
import pytest

from b70bench import device, timing


def test_statistics_match_numpy():
    rng = np.random.default_rng(1)
    samples = list(rng.exponential(size=101))
    t = timing.Timing(samples)
    assert t.median == pytest.approx(float(np.median(samples)))
    assert t.quantile(0.9) == pytest.approx(float(np.quantile(samples, 0.9)))
    assert t.iqr == pytest.approx(float(np.quantile(samples, 0.75) - np.quantile(samples, 0.25)))
    assert t.min == min(samples) and t.max == max(samples)


def test_asv_form_and_summary():
    t = timing.Timing([1e-6, 2e-6, 4e-6])
    assert t.asv() == {"samples": [1e-6, 2e-6, 4e-6], "number": 1}
    s = t.summary()
    assert s["time_us"] == pytest.approx(2.0)
    assert s["time_us_min"] == pytest.approx(1.0)
    assert s["samples"] == 3


def test_measure_runs_warmup_then_repeat_times_number():
    dev = device.select("cpu")
    calls = []
    t = timing.measure(dev, lambda: calls.append(1), warmup=3, repeat=4, number=5)
    assert len(calls) == 3 + 4 * 5
    assert len(t.samples) == 4


def test_measure_reports_seconds_per_call():
    dev = device.select("cpu")
    t = timing.measure(dev, lambda: time.sleep(0.002), warmup=1, repeat=5, number=3)
    # Each sample is the mean of 3 calls of >= 2 ms: never less, and not the sum of the 3.
    assert 0.002 <= t.min
    assert statistics.median(t.samples) < 0.006 * 3


def test_measure_rejects_bad_counts():
    with pytest.raises(ValueError):
        timing.measure(device.select("cpu"), lambda: None, repeat=0)
