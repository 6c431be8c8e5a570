"""Path arguments as people type them: relative to where the command runs, and absolute; a wrong one is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def b70bench(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run(
        [sys.executable, "-m", "b70bench", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_revisions_plan_takes_the_interpreter_relative_or_absolute(tmp_path, form):
    python = os.path.relpath(sys.executable, tmp_path) if form == "relative" else sys.executable
    done = b70bench(tmp_path, "revisions", "HEAD", "--repo", str(ROOT), "--python", python, "--plan")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "plan: 1 commit" in done.stdout


@pytest.mark.parametrize("command", [["revisions", "HEAD", "--repo", str(ROOT), "--plan"], ["patches", "status"]])
def test_an_interpreter_that_is_not_there_is_one_line(tmp_path, command):
    done = b70bench(tmp_path, *command, "--python", ".venv/bin/python")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"no interpreter at {tmp_path / '.venv/bin/python'}" in lines[0] and "--python .venv/bin/python" in lines[0]
