"""Drift injected on purpose: a CPU hog in its own process, started and stopped by PID.

The verdicts must hold on a host whose speed moves under them; their tests and the scripts that measure their
power and false-alarm rates start this hog mid-measurement to make it move. It is a busy loop at nice 10: at nice 0
it takes half of a core and every OpenMP barrier of a decoding engine then waits on the thread sharing that core
(calls 5-10x slower, a stall rather than drift); at 10 it gets about a tenth of a core when the engines want it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

NICE = 10

# A condition the hog's thread waits on: given the event set when the `with` block ends, True means "go on".
Wait = Callable[[threading.Event], bool]


class Hog:
    """One busy process, its start and stop kept in `events` as (what, seconds since created, pid).

    `start()` / `stop()` by hand, or `between(start_when, stop_when)` on a thread; leaving the `with` block always
    stops it and reaps the process.
    """

    def __init__(self, nice: int = NICE):
        self.nice, self.proc, self.events = nice, None, []
        self.t0 = time.monotonic()
        self.done = threading.Event()
        self.lock = threading.Lock()  # the thread and the end of the block may both stop it
        self.thread: threading.Thread | None = None

    @property
    def ran(self) -> bool:
        return bool(self.events)

    def start(self) -> None:
        with self.lock:
            if self.proc is not None:
                return
            self.proc = subprocess.Popen(["nice", "-n", str(self.nice), sys.executable, "-c", "while True: pass"])
            self.events.append(("hog started", round(time.monotonic() - self.t0, 1), self.proc.pid))

    def stop(self) -> None:
        with self.lock:
            if self.proc is None or self.proc.returncode is not None:
                return
            self.proc.kill()
            self.proc.wait()
            self.events.append(("hog stopped", round(time.monotonic() - self.t0, 1), self.proc.pid))

    def between(self, start_when: Wait, stop_when: Wait) -> Hog:
        """Start once `start_when` returns True; stop once `stop_when` returns, or when the block ends."""

        def run() -> None:
            if start_when(self.done) and not self.done.is_set():
                self.start()
                stop_when(self.done)
                self.stop()

        self.thread = threading.Thread(target=run, daemon=True)
        return self

    def after(self, start_s: float, for_s: float) -> Hog:
        """Busy from `start_s` to `start_s + for_s` seconds after the block starts."""
        return self.between(lambda done: not done.wait(start_s), lambda done: not done.wait(for_s))

    def __enter__(self) -> Hog:
        self.t0 = time.monotonic()
        if self.thread is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.stop()
