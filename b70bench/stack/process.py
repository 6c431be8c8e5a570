"""Processes of the stack under test: process groups, reaping, an idle host before a start, a fixed layout.

Every vLLM process b70bench starts (decode's child and live engines, serve's server, moe-down's kernel processes)
runs in a session of its own, so its pid is its process group id; whichever way it ends, the whole group gets
SIGTERM, then SIGKILL, and nothing of it is left holding memory or cores.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import signal
import subprocess
import threading
import time

from b70bench.stack.host import cpu_jiffies

TERM_GRACE_S = 10.0
ORPHAN_GRACE_S = 30.0  # an orphaned engine's own stop (vLLM takes up to ~35 s) before its group gets SIGKILL

# Runs `python -m MODULE ARGS` (runpy, same process) with a thread that watches the process that started it: once
# that is gone (SIGKILLed by asv at its timeout, a kill -9 of a walk), the whole group gets SIGTERM, then SIGKILL.
# A session of its own lets a stop reach every worker of an engine, and it would otherwise outlive its starter on the
# GPUs. Inline, importing nothing of b70bench: a server runs on the walked environment's interpreter.
_GUARD = """
import os, runpy, signal, sys, threading, time
parent, grace = int(sys.argv[1]), float(sys.argv[2])
def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os.killpg(0, signal.SIGTERM)
    time.sleep(grace)
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=watch, daemon=True).start()
sys.argv = sys.argv[3:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def guarded(python: str, module: str, *args: str) -> list[str]:
    """The command for `python -m module args` in a session of its own (the caller passes start_new_session=True)
    that takes its group down when this process dies without stopping it."""
    return [python, "-c", _GUARD, str(os.getpid()), str(ORPHAN_GRACE_S), module, *args]


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


def interrupt(signum, _frame) -> None:
    """A SIGTERM handler: unwind like Ctrl-C, so every `finally` that stops an engine, a server or a walk runs.
    Once: a second SIGTERM (`timeout` forwards the one `pkill` also sent) must not cut that clean-up short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def unwind_on_sigterm() -> None:
    """Install interrupt() for SIGTERM (only the main thread can; elsewhere nothing changes)."""
    try:
        signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        pass


def unwind_when_orphaned(poll_s: float = 1.0) -> None:
    """Once the process that started this one is gone (asv killed mid-set-up leaves its benchmark process to init,
    in a process group of its own, still measuring), SIGTERM this process, so that unwind_on_sigterm's handler stops
    every engine and server it started."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="b70bench-orphan-watch").start()


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
