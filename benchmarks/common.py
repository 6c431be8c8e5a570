"""Shared by the asv suites: the device under test and asv's way of skipping."""

from b70bench import device
from b70bench.errors import UsageError


def select_device() -> device.Device:
    """The device for this asv run (B70BENCH_BACKEND / B70BENCH_DEVICE_INDEX pick it)."""
    try:
        return device.select()
    except UsageError as err:
        raise NotImplementedError(str(err)) from None


def skip_if(reason: str | None) -> None:
    """asv skips a benchmark whose setup raises NotImplementedError; reason says why."""
    if reason:
        raise NotImplementedError(reason)
