"""Child processes that never outlive the run: each in a session of its own, taken down with its whole group.

Every process b70bench starts for a measurement (vLLM engines and servers, moe-down's kernel processes, torch
ranks) runs in a session of its own, so its pid is its process group id; whichever way it ends, the whole group gets
SIGTERM, then SIGKILL, and nothing of it is left holding memory or cores. SIGTERM to b70bench itself unwinds like
Ctrl-C, so every `finally` that stops a child runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

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


def spawn(
    module: str,
    args: list[str],
    *,
    env: dict,
    log,
    python: str | None = None,
    stdin=subprocess.DEVNULL,
    pass_fds: tuple[int, ...] = (),
    prefix: tuple[str, ...] | list[str] = (),
    text: bool = False,
) -> subprocess.Popen:
    """`python -m module args`, guarded, in a session of its own, its output to the open file `log`. prefix runs
    before the interpreter and must exec it (setarch does), so the pid is still the process group's id."""
    return subprocess.Popen(
        [*prefix, *guarded(python or sys.executable, module, *args)],
        stdin=stdin,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        pass_fds=pass_fds,
        start_new_session=True,
        text=text,
    )
