"""How long a device was busy, from a torch.profiler (Kineto) Chrome trace: the union of its kernel, copy and set
intervals, so kernels overlapping on two streams count once.

Why: on an NVIDIA GPU vLLM's asynchronous scheduling overlaps the host's work for the next step with the device's
for this one, so a step takes the longer of the two. Device busy time a token beside wall time a token says which
side a step waits on: near 1, the device's (a slower kernel shows in the tokens per second); well below, the
host's (it hides the device's work).
"""

from __future__ import annotations

# Kineto's categories for work on the device itself (not the host's launch calls, "cuda_runtime"/"cuda_driver").
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def device_intervals(trace: dict) -> list[tuple[float, float]]:
    """(start_us, end_us) of every device event of a Chrome trace (`traceEvents`, complete events `ph` "X")."""
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and str(ev.get("cat", "")).lower() in DEVICE_CATEGORIES and ev.get("dur") is not None:
            start = float(ev["ts"])
            out.append((start, start + float(ev["dur"])))
    return out


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of the intervals (microseconds)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summary(trace: dict) -> dict:
    """busy_us, kernel-time sum (overlap counted twice), count and first-to-last span of the device events."""
    iv = device_intervals(trace)
    if not iv:
        return {"events": 0, "busy_us": 0.0, "sum_us": 0.0, "span_us": 0.0}
    return {
        "events": len(iv),
        "busy_us": busy_us(iv),
        "sum_us": sum(b - a for a, b in iv),
        "span_us": max(b for _, b in iv) - min(a for a, _ in iv),
    }
