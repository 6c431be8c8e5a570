"""Samples and their statistics, in the form asv stores.

A sample is the time of one call in seconds. Where one call is too short to time alone,
a sample is the mean of `number` back-to-back calls (or of one graph replay of `number`
captured calls), as nccl-tests and asv both do.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from b70bench.device import Device


@dataclass
class Timing:
    samples: list[float] = field(default_factory=list)  # seconds per call

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile, q in [0, 1]."""
        s = sorted(self.samples)
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    @property
    def iqr(self) -> float:
        """Spread: the 75th minus the 25th percentile, robust to the odd slow sample."""
        return self.quantile(0.75) - self.quantile(0.25)

    def asv(self) -> dict:
        """asv's track_ return form: it computes median and confidence interval from it."""
        return {"samples": list(self.samples), "number": 1}

    def summary(self, prefix: str = "time", scale: float = 1e6, unit: str = "us") -> dict:
        """Flat record fields: time_us, time_us_min, time_us_iqr, samples."""
        key = f"{prefix}_{unit}"
        return {
            key: self.median * scale,
            f"{key}_min": self.min * scale,
            f"{key}_iqr": self.iqr * scale,
            "samples": len(self.samples),
        }


def measure(device: Device, fn, *, warmup: int = 5, repeat: int = 30, number: int = 1, graph: bool = False) -> Timing:
    """Time fn on device: warm up, then `repeat` samples of `number` calls each.

    graph=True captures `number` calls in a device graph and times its replays, which
    removes host launch gaps from tiny ops (the figure the device can reach, not what an
    eager Python loop gets).
    """
    if repeat < 1 or number < 1:
        raise ValueError("repeat and number must be >= 1")
    if graph:
        # One replay runs the `number` captured calls.
        call, reps = device.capture(fn, number=number, warmup=warmup).replay, 1
    else:
        call, reps = fn, number
        for _ in range(warmup):
            fn()
        device.synchronize()
    return Timing([device.elapsed(call, reps) / number for _ in range(repeat)])
