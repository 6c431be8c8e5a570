"""Shared by the asv suites: the device under test, asv's way of skipping, the walk's settings, asv's values."""

import math
import os

from b70bench.errors import UsageError


def select_device(backend: str | None = None):
    """The device for this asv run (backend, else B70BENCH_BACKEND; B70BENCH_DEVICE_INDEX picks the index)."""
    from b70bench import device  # imports torch: left to the processes that measure (see bench_allreduce)

    try:
        return device.select(backend)
    except UsageError as err:
        raise NotImplementedError(str(err)) from None


def skip_if(reason: str | None) -> None:
    """asv skips a benchmark whose setup raises NotImplementedError; reason says why."""
    if reason:
        raise NotImplementedError(reason)


def whole_from_env(name: str, default: int, least: int, what: str) -> int:
    """A whole-number setting from the environment, default when unset; a bad one skips with its fix."""
    text = os.environ.get(name)
    if not text:
        return default
    if not text.isdigit() or int(text) < least:
        raise NotImplementedError(f"{name}={text!r}: set a whole number of {what} >= {least}")
    return int(text)


def budget_s_from_env(name: str, default_min: float, least_min: float) -> float:
    """A paired measurement's budget: minutes from the environment, in seconds; a bad one skips with its fix."""
    text = os.environ.get(name)
    if not text:
        return default_min * 60
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value < least_min:
        raise NotImplementedError(f"{name}={text!r}: set {least_min:g} or more minutes per commit")
    return value * 60


def paired_walk(dev, switch: str) -> bool:
    """Walking commits (asv sets ASV_COMMIT): measure each against its git parent in blocks, placed as `compare`'s
    auto places them (together on the CPU, one process at a time on a GPU or XPU), unless the switch variable is 0
    (`make bench`, one commit: per-start samples)."""
    return bool(os.environ.get("ASV_COMMIT")) and os.environ.get(switch) != "0"


def samples(values):
    """A track figure with one sample per start or block (asv's interval sees their spread); NaN where none."""
    return {"samples": values, "number": 1} if values else math.nan


def value(record: dict, key: str):
    """A one-value track figure; NaN where the record has none."""
    got = record.get(key)
    return math.nan if got is None else got
