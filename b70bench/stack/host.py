"""The host's state around a timed call: a fixed-work probe, CPU time others took, peak memory."""

from __future__ import annotations

import os
import time


def _vm_hwm_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def peak_memory() -> tuple[int | None, str]:
    """Peak host memory of this process and the engine processes it started (sum of high-water marks).

    On a GPU the device's memory in use is the figure that matters; vLLM holds it in its
    worker processes, so it is read device-wide at the end of the run.
    """
    try:
        import torch

        for name in ("cuda", "xpu"):
            mod = getattr(torch, name, None)
            if mod is not None and mod.is_available():
                free, total = mod.mem_get_info(0)
                return int(total - free), f"{name} device memory in use at end (all processes)"
    except Exception:
        pass
    try:
        import psutil

        pids = [os.getpid()] + [p.pid for p in psutil.Process().children(recursive=True)]
    except Exception:
        pids = [os.getpid()]
    total = sum(_vm_hwm_bytes(pid) for pid in pids)
    return (total or None), "host RSS high-water mark, summed over the engine's processes"


def cpu_jiffies() -> tuple[int, int]:
    """(all, busy) clock ticks of all cores so far, from /proc/stat; busy is anything but idle and iowait."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:9]]
    return sum(vals), sum(vals) - vals[3] - vals[4]


class Interference:
    """CPU time other processes took while we timed: system-wide busy time minus this run's processes'.

    A shared 2-core machine makes timings wander; this says by how much others were in the way
    (as a share of all cores), so a slow figure can be told from a slow build.
    """

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK")
        self.ncpu = os.cpu_count() or 1
        try:
            import psutil

            self.pids = [os.getpid()] + [p.pid for p in psutil.Process().children(recursive=True)]
        except Exception:
            self.pids = [os.getpid()]

    def _jiffies(self) -> tuple[int, int]:
        busy = cpu_jiffies()[1]
        mine = 0
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                mine += int(fields[11]) + int(fields[12])  # utime, stime
            except (OSError, IndexError, ValueError):
                pass
        return busy, mine

    def start(self) -> None:
        try:
            self._t0, self._j0 = time.perf_counter(), self._jiffies()
        except OSError:
            self._j0 = None

    def share(self) -> float | None:
        if getattr(self, "_j0", None) is None:
            return None
        (busy, mine), wall = self._jiffies(), time.perf_counter() - self._t0
        foreign = max(0, (busy - self._j0[0]) - (mine - self._j0[1])) / self.hz
        return foreign / (wall * self.ncpu) if wall > 0 else None


PROBE_N = 300_000


def host_probe(reps: int = 3, clock=time.perf_counter) -> float:
    """Fastest of `reps` runs of a fixed pure-Python loop (~12 ms here), in seconds.

    The same work every time, so a change says the host got slower or faster: on the 2-core VM
    this moved by 5-70% within minutes with the VM idle (docs/decode.md), which is what makes
    separate vLLM starts disagree. Taken before and after the timed calls of every run.
    """
    best = float("inf")
    for _ in range(reps):
        t0, acc = clock(), 0
        for i in range(PROBE_N):
            acc += i * i
        best = min(best, clock() - t0)
    return best
