"""asv's own handling of a long set-up, and of its own death mid-set-up, with this checkout's adapter helpers and a
fake engine (the process protocol of b70bench.paired.live, no vLLM).

asv (POSIX) ends a set-up that prints nothing for `setup_cache.timeout` seconds: SIGTERM to the set-up's process
group, SIGKILL a second later. A walk's set-up on a rig runs for hours; the adapters say each block as it ends
(benchmarks/common.say, flushed: a pipe would hold the lines back) and set a limit longer than the whole set-up
(setup_timeout_s), so only a silence longer than the limit could end one. Here a set-up of 8 s runs against a limit
of 3 s, as a walk's hours run against its hour: speaking, it is not cut; silent, asv cuts it, and its engine goes.
Then asv itself is SIGKILLed mid-set-up (its benchmark process is left to init, in a group of its own): the
benchmark process unwinds (common.paired_walk), its engine is stopped, nothing is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

ENGINE = """
import json, os, sys
out = os.fdopen(int(sys.argv[2]), "w", buffering=1)
out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\\n")
for line in sys.stdin:
    if line.strip() == "stop":
        out.write(json.dumps({"stopped": True}) + "\\n")
        break
"""

SUITE = """
import os, time
from pathlib import Path

from benchmarks.common import paired_walk, say
from b70bench.paired.live import LiveProcess


class Engine(LiveProcess):
    module = "sleepy_engine"


class LongSetUp:
    def setup_cache(self):
        paired_walk(None, "LONG_PAIRED")  # a walked commit: unwinds on SIGTERM and when asv is gone
        work = Path(os.environ["LONG_WORK"])
        engine = Engine("A", {}, dict(os.environ, PYTHONPATH=str(work)), work / "engine.log")
        try:
            (work / "engine.pid").write_text(str(engine.ready(30)["pid"]))
            for i in range(int(os.environ["LONG_STEPS"])):
                time.sleep(1.0)
                if os.environ["LONG_SPEAKS"] == "1":
                    say(f"block {i + 1}: B/A 1.000")
        finally:
            engine.close()
        (work / "done").write_text("the set-up finished")
        return 1.0

    setup_cache.timeout = float(os.environ.get("LONG_LIMIT_S", "60"))

    def track_done(self, cache):
        return cache
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def project(tmp_path):
    repo = tmp_path / "proj"
    (repo / "suite").mkdir(parents=True)
    (repo / "suite" / "__init__.py").write_text("")
    (repo / "suite" / "bench_long.py").write_text(SUITE)
    (tmp_path / "sleepy_engine.py").write_text(ENGINE)
    conf = {
        "version": 1,
        "project": "long",
        "repo": ".",
        "branches": ["main"],
        "benchmark_dir": "suite",
        "results_dir": str(tmp_path / "results"),
        "html_dir": str(tmp_path / "html"),
        "environment_type": "existing",
    }
    (repo / "asv.conf.json").write_text(json.dumps(conf))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "long set-up"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    env = dict(os.environ, HOME=str(tmp_path), ASV_PYTHONPATH=str(ROOT), LONG_WORK=str(tmp_path))
    env.update(B70BENCH_COMMIT=commit)  # what `b70bench revisions` gives a walked commit's benchmarks
    for name in ("PYTHONUNBUFFERED", "PYTHONPATH"):  # the adapters must flush by themselves
        env.pop(name, None)
    machine = [sys.executable, "-m", "asv", "machine", "--yes", "--machine", "long"]
    assert subprocess.run(machine, cwd=repo, env=env, capture_output=True, timeout=120).returncode == 0
    cmd = [sys.executable, "-m", "asv", "run", "-E", f"existing:{sys.executable}", "--set-commit-hash", commit]
    cmd += ["--machine", "long", "--bench", "LongSetUp", "--show-stderr"]
    return tmp_path, repo, env, cmd


def asv(project, **env):
    tmp_path, repo, base, cmd = project
    return subprocess.run(cmd, cwd=repo, env=dict(base, **env), capture_output=True, text=True, timeout=300)


def test_a_set_up_longer_than_asvs_limit_is_not_cut_while_it_says_its_blocks(project):
    tmp_path = project[0]
    done = asv(project, LONG_LIMIT_S="3", LONG_STEPS="8", LONG_SPEAKS="1")
    log = done.stdout + done.stderr
    assert (tmp_path / "done").exists(), log[-3000:]
    assert "track_done" in log and "setup_cache failed" not in log, log[-3000:]
    assert not alive(int((tmp_path / "engine.pid").read_text()))


def test_a_silent_set_up_is_cut_at_asvs_limit_and_its_engine_goes(project):
    tmp_path = project[0]
    t0 = time.monotonic()
    done = asv(project, LONG_LIMIT_S="3", LONG_STEPS="8", LONG_SPEAKS="0")
    log = done.stdout + done.stderr
    assert not (tmp_path / "done").exists() and "setup_cache failed" in log, log[-3000:]
    assert time.monotonic() - t0 < 60, log[-3000:]
    pid = int((tmp_path / "engine.pid").read_text())
    deadline = time.monotonic() + 45
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(pid), f"engine {pid} outlived the set-up asv cut"


def test_asv_killed_mid_set_up_leaves_no_engine_and_no_benchmark_process(project):
    tmp_path, repo, base, cmd = project
    env = dict(base, LONG_LIMIT_S="600", LONG_STEPS="300", LONG_SPEAKS="0")  # silent, as in a long start
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "engine.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert (tmp_path / "engine.pid").exists(), "the set-up never started its engine"
        pid = int((tmp_path / "engine.pid").read_text())
        bench = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and b"setup_cache" in _cmdline(p) and str(repo).encode() in _cmdline(p)
        ]
        assert bench, "no set-up process found"
        os.kill(proc.pid, signal.SIGKILL)  # asv alone: its benchmark process is in a process group of its own
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while (alive(pid) or any(map(alive, bench))) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive(pid), f"engine {pid} outlived asv"
        assert not any(map(alive, bench)), f"set-up process {bench} outlived asv"
        assert not (tmp_path / "done").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""
