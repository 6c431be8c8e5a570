"""The process protocol of a paired side: the parent's handle on one live process, started from a spec file in a
session of its own, answering commands read from its stdin with one JSON line each on a reply pipe.

The first line is the start's result ("ready": true) or "ok": false and the error; every later line answers one
"call"; "stop" ends it. Whatever the process does, close() leaves nothing of its group alive. What runs in it
(vLLM's engines: stack.live; moe-down's kernels: moe.pair) subclasses LiveProcess: the module it runs, and how a
failure reads (reason, explain).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from b70bench import children

# A start is tens of seconds on the CPU default (import, compile, gate, warm-up); a call well under one. A target
# passes its own start timeout (a stack's start_timeout_s).
START_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 120.0


class EngineError(RuntimeError):
    """One side's process failed: it did not start, died, or did not answer in time (one line)."""


class LiveProcess:
    """The parent's handle on one live process: `python -m <module> SPEC.json FD`, its own process group."""

    module: str  # the subclass's: the module run with -m (tests put stand-ins speaking the same protocol here)
    spawn = staticmethod(children.spawn)  # what starts it (stack.live's: the stack's one launcher)

    def __init__(self, side: str, spec: dict, env: dict, log_path: Path, python: str | None = None):
        self.side, self.log_path = side, Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path = self.log_path.with_suffix(".spec.json")
        spec_path.write_text(json.dumps(spec, indent=2) + "\n")
        rfd, wfd = os.pipe()
        self._log = open(self.log_path, "w")
        try:
            self.proc = self.spawn(
                self.module,
                [str(spec_path), str(wfd)],
                env=env,
                log=self._log,
                python=python,
                stdin=subprocess.PIPE,
                pass_fds=(wfd,),
                text=True,
            )
        except BaseException:
            os.close(rfd)
            raise
        finally:
            os.close(wfd)
        self._rfd, self._buf = rfd, b""
        self.started_at = time.monotonic()

    def _line(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineError(f"side {self.side}: no answer in {timeout_s:.0f} s (log: {self.log_path})")
            ready, _, _ = select.select([self._rfd], [], [], left)
            if ready:
                chunk = os.read(self._rfd, 65536)
                if not chunk:
                    raise EngineError(
                        f"side {self.side}: the engine {self._exit()} before answering: "
                        f"{self.reason() or 'see ' + str(self.log_path)}"
                    )
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        msg = json.loads(line)
        if msg.get("ok") is False:
            raise EngineError(f"side {self.side}: {self.explain(msg.get('error') or '')} (log: {self.log_path})")
        return msg

    def _exit(self) -> str:
        """How the engine's process ended, once it has: its reply pipe closes a moment before it can be reaped."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "closed its reply pipe (still running)"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def reason(self) -> str | None:
        """The cause of a failure as the process's log tells it, where the subclass can read one."""
        return None

    def explain(self, error: str) -> str:
        """The line a failed start or call reports: the process's own error, or its log's reason without one."""
        return error or self.reason() or "no reason given"

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> dict:
        msg = self._line(timeout_s)
        msg["wall_to_ready_s"] = time.monotonic() - self.started_at
        return msg

    def call(self, timeout_s: float = CALL_TIMEOUT_S) -> dict:
        try:
            self.proc.stdin.write("call\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise EngineError(f"side {self.side}: the engine is gone: {self.reason() or self.log_path}") from None
        return self._line(timeout_s)

    def close(self) -> list[int]:
        """Stop the engine (politely, then its whole process group); returns pids that survived (none)."""
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            pass
        survivors = children.kill_group(self.proc.pid, grace_s=5.0)
        self.proc.wait()
        for f in (self.proc.stdin, self._log):
            try:
                f.close()
            except OSError:
                pass
        os.close(self._rfd)
        return survivors


class EngineHandle:
    """One side's live process as the placement drives it (placement.Handle); gap_s: the pause before each call."""

    def __init__(self, engine: LiveProcess, gap_s: float, start_timeout_s: float = START_TIMEOUT_S):
        self.engine, self.gap_s, self.start_timeout_s = engine, gap_s, start_timeout_s

    def ready(self) -> dict:
        msg = self.engine.ready(self.start_timeout_s)
        msg["log_path"] = str(self.engine.log_path)
        return msg

    def warm(self) -> None:
        time.sleep(self.gap_s)
        self.engine.call()

    def call(self) -> dict:
        time.sleep(self.gap_s)
        got = self.engine.call()
        return {"probe_s": got["probe_s"], "latency_s": got["latency_s"], "cpu": got.get("cpu")}

    def stop(self) -> list[int]:
        return self.engine.close()
