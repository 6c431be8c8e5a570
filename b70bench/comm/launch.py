"""Rank processes for one node: spawn, watch, kill, reap.

`b70bench allreduce --world-size N` starts N fresh Python processes running the same rank
entry point that torchrun or mpirun would start (`python -m b70bench.allreduce`), rendezvous
over TCP on a free localhost port. The parent is a watchdog: the first rank to exit non-zero,
or the run outliving its timeout, kills every rank's process group and names the culprit in
one line. Every child is reaped before launch() returns or raises.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from b70bench import children

ENV_PARAMS = "B70BENCH_AR_PARAMS"
ENV_DIR = "B70BENCH_AR_DIR"
RESULT_FILE = "result.json"


class RankFailure(RuntimeError):
    """A rank died or hung; the message is one line naming it. pids: the processes, all reaped."""

    def __init__(self, message: str, pids: list[int]):
        super().__init__(message)
        self.pids = pids


def rank_env(environ=os.environ) -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when a launcher started this process, else None.

    torchrun (and our own launcher) set RANK/WORLD_SIZE/LOCAL_RANK; Open MPI sets
    OMPI_COMM_WORLD_*; MPICH and Slurm's PMI set PMI_RANK/PMI_SIZE.
    """
    for rank_key, size_key, local_key in (
        ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ):
        if rank_key in environ and size_key in environ:
            rank, size = int(environ[rank_key]), int(environ[size_key])
            return rank, size, int(environ.get(local_key, rank))
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Status:
    """A rank's progress, one small file per rank, so a hang can be pinned on the rank that stopped first."""

    def __init__(self, directory: str | None, rank: int):
        self.path = Path(directory) / f"rank{rank}.status" if directory else None
        self.step = 0

    def __call__(self, label: str) -> None:
        self.step += 1
        if self.path is not None:
            self.path.write_text(f"{self.step}\t{label}\n")

    def error(self, text: str) -> None:
        if self.path is not None:
            self.path.write_text(f"{self.step}\terror: {text}\n")


def read_status(directory: str, rank: int) -> tuple[int, str]:
    try:
        step, label = (Path(directory) / f"rank{rank}.status").read_text().rstrip("\n").split("\t", 1)
        return int(step), label
    except (OSError, ValueError):
        return 0, "not started"


def _child_env(rank: int, world: int, port: int, params_json: str, directory: str, cpu: bool) -> dict:
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        PYTHONUNBUFFERED="1",
    )
    env[ENV_PARAMS] = params_json
    env[ENV_DIR] = directory
    for key in [k for k in env if k.startswith(("OMPI_COMM_WORLD_", "PMI_"))]:
        del env[key]  # this process may itself run under mpirun; its children are ours, not MPI's
    if cpu:
        # N ranks share the cores; oversubscribed intra-op threads would time the scheduler, not gloo.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # each rank leads its own group: its descendants go too
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        p.wait()


def launch(params_json: str, world: int, *, timeout_s: float, cpu: bool) -> dict:
    """Run `world` ranks to completion; rank 0's result payload, or RankFailure."""
    directory = tempfile.mkdtemp(prefix="b70bench-allreduce-")
    port = free_port()
    cmd = children.guarded(sys.executable, "b70bench.allreduce")
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(world):
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=_child_env(rank, world, port, params_json, directory, cpu),
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                )
            )
        failure = _watch(procs, directory, timeout_s)
        if failure:
            _kill_all(procs)
            raise RankFailure(failure, [p.pid for p in procs])
        result = Path(directory) / RESULT_FILE
        if not result.exists():
            raise RankFailure("rank 0 exited 0 but wrote no result", [p.pid for p in procs])
        return json.loads(result.read_text())
    finally:
        _kill_all(procs)  # no-op for reaped ranks; on any exception (^C too) nothing is left behind
        for f in Path(directory).glob("*"):
            f.unlink()
        os.rmdir(directory)


def _watch(procs: list[subprocess.Popen], directory: str, timeout_s: float) -> str | None:
    """None when every rank exited 0; else the one-line reason."""
    start = time.monotonic()
    while True:
        codes = [p.poll() for p in procs]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            return _died(failed, directory)
        if all(code == 0 for code in codes):
            return None
        waited = time.monotonic() - start
        if waited > timeout_s:
            return _hung([r for r, c in enumerate(codes) if c is None], directory, waited)
        time.sleep(0.05)


# Errors a rank raises because a peer went away: they follow the failure, they are not it.
_SECONDARY = re.compile(r"peer|remote|connection (closed|reset)|aborted|broken pipe", re.IGNORECASE)


def _died(failed: list[tuple[int, int]], directory: str) -> str:
    """One line naming the rank that failed first; ranks that only lost a peer are mentioned after it."""

    def describe(rank, code):
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        _, label = read_status(directory, rank)
        if label.startswith("error: "):
            return f"rank {rank} died ({how}): {label[len('error: ') :]}", bool(_SECONDARY.search(label))
        return f"rank {rank} died ({how}) at '{label}'", False

    described = sorted((describe(rank, code) for rank, code in failed), key=lambda d: d[1])
    first, rest = described[0][0], [d[0][:160] for d in described[1:]]
    return first + (f" (then {'; '.join(rest)})" if rest else "")


def _hung(running: list[int], directory: str, waited: float) -> str:
    progress = {rank: read_status(directory, rank) for rank in running}
    least = min(step for step, _ in progress.values())
    stuck = [r for r in running if progress[r][0] == least]
    others = [f"rank {r} waiting at '{progress[r][1]}'" for r in running if r not in stuck]
    where = ", ".join(f"rank {r} hung at '{progress[r][1]}'" for r in stuck)
    tail = f"; {', '.join(others)}" if others else ""
    return f"{where} (timeout after {waited:.0f} s; all ranks killed){tail}"
