"""Run child.py in a fresh process group, with a timeout, and leave nothing behind.

vLLM's engine core and workers are children of the child; a hang or a crash must not leave
them holding memory or cores. The child gets its own session (so its process group id is
its pid); on timeout or failure the whole group gets SIGTERM, then SIGKILL, and the run
waits until no process of that group is alive before it returns.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from b70bench.children import kill_group
from b70bench.decode.child import RESULT_PREFIX
from b70bench.stack import launch, logs


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


def _result_line(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        i = line.find(RESULT_PREFIX)
        if i >= 0:
            try:
                return json.loads(line[i + len(RESULT_PREFIX) :])
            except ValueError:
                return None
    return None


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
        proc = launch.spawn(module, [str(spec_path)], env=env, log=logf, python=python, prefix=prefix)
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
            # The cause is logged before the child's result line; what follows is teardown (workers shutting down after
            # the engine died, which can raise errors of their own that would otherwise read as the last cause).
            cut = text.rfind("\n" + RESULT_PREFIX)
            before = text[:cut] if cut >= 0 else text
            reason = logs.failure_reason(before) or result.get("error") or f"child exited with code {proc.returncode}"
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
