"""A walk you can follow and resume: blocks on revisions' terminal while asv runs, `revisions --status`, and a
commit's finished blocks journaled so a kill -9 mid-commit loses only the block under way.

Two halves. The journal and the stopping rule in one process (a simulated target, no engines): a measurement
interrupted mid-block goes on at its next block, its first blocks read back exactly, an alternate one warmed again;
the budget counts the journaled minutes. Then `b70bench revisions` for real over a two-commit history with asv and
fake engines (tests/fake_live.py, no vLLM): under a pseudo-terminal, a block line arrives while the walk still runs
and `--status` from another process names the commit and the block; killed with SIGKILL (its whole process group)
after two journaled blocks, the same command restores the environment, keeps those blocks and decides from old and
new together.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fakedist  # noqa: E402
from gitrepo import git  # noqa: E402

from b70bench import patches, stats  # noqa: E402
from b70bench.paired import placement as placements  # noqa: E402
from b70bench.paired import stopping  # noqa: E402
from b70bench.paired.blocks import Block  # noqa: E402
from b70bench.paired.journal import Journal  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
REL = "fakevllm/models/minimax_m2.py"
TARGET = "dist:fakevllm==0.32.0"


class Killed(BaseException):
    """What a kill -9 is to the measurement: nothing after it runs in that process (not an error of a side)."""


class SimHandle:
    def __init__(self, target, side):
        self.target, self.side, self.n = target, side, 0

    def ready(self):
        self.target.started.append(self.side)
        return {"pid": 0}

    def warm(self):
        pass

    def call(self):
        self.target.calls += 1
        if self.target.calls == self.target.kill_at:
            raise Killed()
        self.n += 1
        slow = 1.1 if self.side == "B" else 1.0
        return {"probe_s": 0.01, "latency_s": 0.1 * slow * (1 + 0.01 * (self.n % 3))}

    def stop(self):
        return []


class SimTarget:
    errors = ()
    backend = "cpu"

    def __init__(self, kill_at=None):
        self.kill_at, self.calls, self.started = kill_at, 0, []

    def start(self, side, label):
        return SimHandle(self, side)


def test_a_measurement_killed_mid_block_goes_on_at_its_next_block(tmp_path):
    """Alternate (the rig's placement): killed in its third block, the next run reads the two finished blocks back
    (the same ratios, the same minutes), warms each side again before counting (its engines are gone), numbers the
    new blocks on from 3 and decides from all of them; the events say what was kept."""
    events = []
    journal = Journal(tmp_path / "blocks", {"commit": "c1", "parent": "c0"}, "decode p16n16b1", events.append)
    rule = stopping.Rule(rounds=6, budget_s=600, level=stopping.WALK_LEVEL, first_blocks=3)
    run = dict(warmup_calls=1, out=lambda _line: None, journal=journal)
    calls_a_block = 2 * 6
    with pytest.raises(Killed):
        stopping.measure_target(
            SimTarget(kill_at=2 * calls_a_block + 5), placements.ALTERNATE, tmp_path / "o1", rule, **run
        )
    kept, looks = journal.read()
    assert [b.index for b in kept] == [0, 1] and looks == []
    assert kept[0].warm_starts and not kept[1].warm_starts  # the first block warmed each side
    again = SimTarget()
    res = stopping.measure_target(again, placements.ALTERNATE, tmp_path / "o2", rule, **run)
    # Alternate's first look is six blocks: two kept, four new, the first new one warmed again.
    assert [b.index for b in res.blocks] == list(range(6))
    assert [b.ratio() for b in res.blocks[:2]] == [b.ratio() for b in kept]
    assert res.blocks[2].warm_starts and not res.blocks[3].warm_starts
    assert again.started[:2] == ["A", "B"] and len(again.started) == 2 + 2 * 4  # two warm starts, four blocks
    assert res.decision.word == stats.SLOWER and res.wall_s >= sum(b.wall_s for b in kept)
    assert [b.index for b in journal.read()[0]] == list(range(6)) and journal.read()[1] == [6]
    begun = [e for e in events if e["event"] == "measure"]
    assert [e["kept"] for e in begun] == [0, 2] and begun[0]["commit"] == "c1" and begun[0]["parent"] == "c0"
    assert [e["block"] for e in events if e["event"] == "block"] == [1, 2, 3, 4, 5, 6]


def _block(i: int, ratio: float, wall_s: float) -> Block:
    calls = []
    for r in range(8):
        calls += [
            {"side": "A", "round": r, "probe_s": 0.01, "latency_s": 0.1},
            {"side": "B", "round": r, "probe_s": 0.01, "latency_s": 0.1 * ratio},
        ]
    return Block(i, calls=calls, wall_s=wall_s)


def test_the_budget_counts_the_journaled_minutes_and_a_lost_block_is_measured_again(tmp_path):
    """Three undecided blocks of ~5 minutes journaled against a 15-minute budget: the resumed run looks at them
    and stops, the budget spent, without starting an engine. A block that lost a counted start is not read back."""
    journal = Journal(tmp_path / "blocks", {"commit": "c1"}, "decode p16n16b1")
    journal.begin([], 900, placements.TOGETHER)
    for i, r in enumerate((1.0, 1.12, 0.9)):
        journal.block(_block(i, r, 290.0), 290.0 * (i + 1))
    lost = _block(3, 1.0, 10.0)
    lost.error = "side B: the engine was killed by SIGKILL"
    journal.block(lost, 880.0)
    rule = stopping.Rule(rounds=8, budget_s=900, level=stopping.WALK_LEVEL, first_blocks=3)
    target = SimTarget()
    res = stopping.measure_target(
        target, placements.TOGETHER, tmp_path / "o", rule, warmup_calls=1, out=lambda _l: None, journal=journal
    )
    assert target.started == [] and len(res.blocks) == 3
    assert res.decision.word == stats.UNDECIDED and "budget" in res.reason and res.minutes >= 14.5
    # Another key (another shape, stack, placement ...) is another measurement: nothing read back.
    assert journal.keyed(shape="p32n32b1").read() == ([], [])


# ---- revisions for real: asv over a two-commit history, fake engines -------------------------------------------------

SUITE = """
import json, os, time
from pathlib import Path

from b70bench.decode import pair
from b70bench.paired import stopping
from benchmarks.common import against_base, paired_walk, samples, walked_commit


class Engine(pair.Engine):
    module = "walk_engine"


class FakeWalk:
    def setup_cache(self):
        paired_walk(None, "FAKE_PAIRED")
        commit = walked_commit()
        work = Path(os.environ["FAKE_WORK"])
        rule = stopping.Rule(rounds=6, budget_s=300, level=stopping.WALK_LEVEL, first_blocks=6)
        res = against_base(commit, work / "paired" / commit[:12], pair.compare_series, rule=rule, shape="p16n16b1",
                           engine_cls=Engine, cache_dir=work / "vllm-cache", spec={"output_len": 128})
        keep = {k: res[k] for k in ("blocks", "block_ratios", "verdict", "minutes", "parent")}
        (work / f"result-{commit}.json").write_text(json.dumps(keep))
        while (work / "hold-after-measuring").exists():  # the pty test holds the walk here to ask --status
            time.sleep(0.2)
        return res["block_ratios"]

    setup_cache.timeout = 300

    def track_ratio(self, ratios):
        return samples(ratios)
"""

# Speaks fake_live's protocol; holds its start while FAKE_HOLD_STARTS names a file that exists (a walk to kill).
ENGINE = """
import os, sys, time
hold = os.environ.get("FAKE_HOLD_STARTS")
while hold and os.path.exists(hold):
    time.sleep(0.1)
import fake_live
raise SystemExit(fake_live.main(sys.argv))
"""


@pytest.fixture
def project(tmp_path):
    """A repo with asv's configuration and the suite above: base, swap (B 10% slower), norm (the same speed)."""
    wheel_dir = tmp_path / "wheel"
    wheel_dir.mkdir()
    site = fakedist.install(fakedist.build_wheel(wheel_dir), tmp_path / "site")
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "walk_engine.py").write_text(ENGINE)
    repo = tmp_path / "repo"
    (repo / "suite").mkdir(parents=True)
    (repo / "suite" / "__init__.py").write_text("")
    (repo / "suite" / "bench_walk.py").write_text(SUITE)
    conf = {
        "version": 1,
        "project": "walk",
        "repo": ".",
        "branches": ["main"],
        "benchmark_dir": "suite",
        "results_dir": str(tmp_path / "results" / "asv"),
        "html_dir": str(tmp_path / "html"),
        "environment_type": "existing",
    }
    (repo / "asv.conf.json").write_text(json.dumps(conf))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / "patches").mkdir()
    step1 = fakedist.MODEL.replace("q + k", "k + q")
    fakedist.write_patch(repo / "patches", "01-swap.patch", TARGET, fakedist.MODEL, step1, REL)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "swap")
    step2 = step1.replace("renormalize=True", "renormalize=False")
    fakedist.write_patch(repo / "patches", "02-norm.patch", TARGET, step1, step2, REL)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "norm")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("B70BENCH_", "ASV_"))}
    env.pop("PYTHONUNBUFFERED", None)  # revisions must flush by itself
    paths = os.pathsep.join(map(str, [ROOT, TESTS, engines, site]))  # this checkout, the fake engine, fake vLLM
    env.update(
        HOME=str(tmp_path),
        PYTHONPATH=paths,
        ASV_PYTHONPATH=paths,
        FAKE_WORK=str(work),
        B70BENCH_CACHE=str(tmp_path / "cache"),
        B70BENCH_BACKEND="cpu",
    )
    cmd = [sys.executable, "-m", "b70bench", "revisions", "HEAD~2..HEAD", "--repo", str(repo), "--machine", "box"]
    cmd += ["--site-dir", str(site), "--prefix", str(tmp_path / "prefix")]
    # bench_decode in the pattern: the plan prices one decode measurement a commit (10 min), which the walk's lines
    # and --status measure against; this suite holds only FakeWalk.
    cmd += ["--asv-args", "--bench FakeWalk|bench_decode"]
    commits = git(repo, "rev-list", "--reverse", "HEAD~2..HEAD").split()
    return dict(tmp=tmp_path, repo=repo, site=site, work=work, env=env, cmd=cmd, commits=commits)


def status(p) -> str:
    cmd = [sys.executable, "-m", "b70bench", "revisions", "--status", "--repo", str(p["repo"])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=p["env"])
    assert done.returncode == 0, done.stderr
    return done.stdout


def ours(p) -> list[int]:
    """Live processes of this test's walk (revisions, asv, its benchmark processes, engines): their environment
    names this test's work folder."""
    mark = f"FAKE_WORK={p['work']}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if mark in (d / "environ").read_bytes().split(b"\0") and "Z" not in (d / "stat").read_text().split()[2]:
                found.append(int(d.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_a_walk_under_a_terminal_shows_each_block_as_it_ends_and_status_says_where_it_is(project):
    p = project
    hold = p["work"] / "hold-after-measuring"
    hold.write_text("")  # the first commit's set-up waits here, after its blocks, until the test lets it go
    master, slave = os.openpty()
    proc = subprocess.Popen(
        p["cmd"], stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=p["env"], start_new_session=True
    )
    os.close(slave)
    seen, text, alive_at_block, during = b"", "", None, None
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the walk closed the terminal: it ended
                    break
                if not chunk:
                    break
                seen += chunk
                text = seen.decode(errors="replace")
            if alive_at_block is None and re.search(r"\[1/2\] \w+ decode p16n16b1 block 6: B/A 1\.\d+", text):
                alive_at_block = proc.poll() is None
                during = status(p)
                hold.unlink()
            if proc.poll() is not None and not ready:
                break
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    assert alive_at_block, text[-4000:]
    assert rc == 0, text[-4000:]
    first, second = p["commits"]
    # Each block came with the commit's minutes against the plan's, and the first commit's estimate.
    assert re.search(rf"\[1/2\] {first[:10]} decode p16n16b1 block 1: B/A 1\.1\d\d \(\d+ s; ", text), text[-4000:]
    assert re.search(r"commit \d+ s of ~10 planned", text)
    assert re.search(rf"\[2/2\] {second[:10]} decode p16n16b1 block \d+: B/A 1\.000", text), text[-4000:]
    # --status from another process while the walk held at its first commit: where it is, and when it ends.
    lines = during.splitlines()
    assert lines[0].startswith("walk of HEAD~2..HEAD (pid ") and lines[0].endswith(f"commit 1 of 2: {first[:10]} swap")
    assert lines[1].startswith("  decode p16n16b1 block 6 (B/A 1.1") and "on this commit of ~" in lines[1], during
    assert lines[2].startswith("  estimated end: ") and "1 after this one" in lines[2], during
    assert status(p).startswith("no walk running: the last walk of HEAD~2..HEAD ended ")


@pytest.mark.slow
def test_a_walk_killed_mid_commit_resumes_with_the_blocks_it_had_finished(project):
    p = project
    first = p["commits"][0]
    held = p["work"] / "hold-starts"
    journals = p["tmp"] / "results" / "b70bench-walk" / "box" / "blocks" / first
    env = dict(p["env"], FAKE_HOLD_STARTS=str(held))
    proc = subprocess.Popen(
        p["cmd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env, start_new_session=True
    )

    def blocks_journaled() -> list[dict]:
        rows = [json.loads(x) for f in journals.glob("*.jsonl") for x in f.read_text().splitlines() if x]
        return [r["block"] for r in rows if "block" in r]

    try:
        deadline = time.monotonic() + 300
        while len(blocks_journaled()) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        held.write_text("")  # the next starts wait: the walk is mid-commit when it is killed
        assert len(blocks_journaled()) >= 2, "no two blocks journaled"
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGKILL)  # revisions' whole group; asv goes with it (PR_SET_PDEATHSIG)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Every process of the killed walk ends: asv, its benchmark process, the engines held at their start.
    deadline = time.monotonic() + 90
    while ours(p) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ours(p), f"left running after the walk was killed: {ours(p)}"
    kept = blocks_journaled()
    assert 2 <= len(kept) < 6 and not (p["work"] / f"result-{first}.json").exists()
    assert "k + q" in fakedist.model_path(p["site"]).read_text()  # killed while the first commit was applied
    killed = status(p)
    assert killed.startswith("no walk running: the walk of HEAD~2..HEAD (pid ") and "killed at commit 1 of 2" in killed
    held.unlink()
    done = subprocess.run(p["cmd"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=p["env"])
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    out = done.stdout
    assert re.search(r"restored .*prefix: a killed walk left \w+'s patches applied", out), out[-4000:]
    assert f"{len(kept)} blocks kept from an earlier run" in out, out[-4000:]
    res = json.loads((p["work"] / f"result-{first}.json").read_text())
    assert res["blocks"] == 6 and res["verdict"] == stats.SLOWER, res
    assert res["block_ratios"][: len(kept)] == [k["ratio"] for k in kept]
    # Measured: its journal moved aside (a later walk measures afresh); the environment is as installed.
    assert not journals.exists() and list((journals.parent.parent / "blocks-measured").glob(f"{first}-*"))
    assert fakedist.model_path(p["site"]).read_text() == fakedist.MODEL
    env = patches.Env(p["tmp"] / "prefix", (str(p["site"]),))
    assert patches.read_journal(env) is None
    assert patches.verify_distribution(patches.find_distribution(env, "fakevllm")) == []
