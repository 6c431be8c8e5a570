"""Run child.py in a fresh process group, with a timeout, and leave nothing behind.

vLLM's engine core and workers are children of the child; a hang or a crash must not leave
them holding memory or cores. The child gets its own session (so its process group id is
its pid); on timeout or failure the whole group gets SIGTERM, then SIGKILL, and the run
waits until no process of that group is alive before it returns.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from b70bench.decode import logs
from b70bench.decode.child import RESULT_PREFIX, cpu_jiffies

TERM_GRACE_S = 10.0


@dataclass
class ChildRun:
    ok: bool
    result: dict = field(default_factory=dict)
    reason: str | None = None  # one line, vLLM's own words where it gave any
    returncode: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    log_path: Path | None = None
    survivors: list[int] = field(default_factory=list)  # pids still alive after the kill (should be none)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is pgid, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces) start after the last ')'.
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) > 2 and rest[0] != "Z" and int(rest[2]) == pgid:
            found.append(int(entry))
    return found


def kill_group(pgid: int, grace_s: float | None = None) -> list[int]:
    """SIGTERM then SIGKILL every process in the group; returns the pids that still live after that."""
    for sig, wait_s in ((signal.SIGTERM, TERM_GRACE_S if grace_s is None else grace_s), (signal.SIGKILL, 5.0)):
        if not group_members(pgid):
            return []
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return []
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and group_members(pgid):
            time.sleep(0.1)
    return group_members(pgid)


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


def _result_line(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        i = line.find(RESULT_PREFIX)
        if i >= 0:
            try:
                return json.loads(line[i + len(RESULT_PREFIX) :])
            except ValueError:
                return None
    return None


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


def run_child(
    spec: dict,
    log_path: Path,
    *,
    env: dict[str, str],
    timeout_s: float,
    header: list[str] | None = None,
    python: str | None = None,
    module: str = "b70bench.decode.child",
    prefix: tuple[str, ...] | list[str] = (),
) -> ChildRun:
    """Start the child, wait up to timeout_s, clean its group, and read its one result line."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path = log_path.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec, indent=2) + "\n")
    with open(log_path, "w") as logf:
        for line in header or []:
            logf.write(line + "\n")
        logf.flush()
        t0 = time.perf_counter()
        # prefix execs (setarch does), so the child's pid is still its process group's id.
        proc = subprocess.Popen(
            [*prefix, python or sys.executable, "-m", module, str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:
            kill_group(proc.pid, grace_s=2.0)
            proc.wait()
            raise
        # Engine processes can outlive a crashed (or even a finished) child: clear the group always.
        survivors = kill_group(proc.pid)
        proc.wait()
        wall = time.perf_counter() - t0
    text = log_path.read_text(errors="replace")
    result = _result_line(text) or {}
    ok = bool(result.get("ok")) and proc.returncode == 0 and not timed_out
    reason = None
    if not ok:
        if timed_out:
            reason = f"timed out after {timeout_s:.0f} s (process group killed)"
        else:
            reason = logs.failure_reason(text) or result.get("error") or f"child exited with code {proc.returncode}"
    return ChildRun(
        ok=ok,
        result=result,
        reason=reason,
        returncode=proc.returncode,
        timed_out=timed_out,
        wall_s=wall,
        log_path=log_path,
        survivors=survivors,
    )
