"""The host around a start of the stack under test: an idle machine before a timed start, a fixed memory layout.
(Starting, reaping and unwinding the processes themselves: b70bench.children.)"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import time

from b70bench.stack.host import cpu_jiffies


def cpu_busy_share(interval_s: float = 1.0) -> float | None:
    """Share of all cores busy (anything but idle and iowait) over interval_s, from /proc/stat."""
    try:
        (t0, b0), _ = cpu_jiffies(), time.sleep(interval_s)
        t1, b1 = cpu_jiffies()
    except (OSError, ValueError):
        return None
    return (b1 - b0) / (t1 - t0) if t1 > t0 else None


def settle(max_wait_s: float = 30.0, busy_below: float = 0.1, interval_s: float = 1.0) -> tuple[float, float | None]:
    """Wait (up to max_wait_s) until the machine is idle before a timed start; returns (waited s, last busy share).

    The previous run's process group is gone by then (run_child waits for it), but the kernel may
    still be reclaiming its memory and other work may be running: on 2 cores either shows up in
    the next run's figures, so the run starts on an idle machine where it can and records how idle.
    """
    t0 = time.monotonic()
    # Dirty pages (a just-installed environment is gigabytes) are written back by kernel threads
    # that compete with the start for the cores, yet count as I/O wait, not as busy: flush first.
    os.sync()
    while True:
        busy = cpu_busy_share(interval_s)
        if busy is None or busy < busy_below or time.monotonic() - t0 >= max_wait_s:
            return time.monotonic() - t0, busy


@functools.cache
def no_aslr_prefix() -> tuple[str, ...]:
    """`setarch <arch> -R`: start a command with address-space randomization off, where that works here.

    With PYTHONHASHSEED fixed too, every start of the same code gets the same memory layout, which
    rules the layout out as a cause of run-to-run spread (it was not the cause here: docs/decode.md).
    Unprivileged; empty where setarch is missing or refuses (then nothing changes).
    """
    exe = shutil.which("setarch")
    if not exe:
        return ()
    prefix = (exe, platform.machine(), "-R")
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else ()
