"""`b70bench revisions`: per-commit apply / benchmark / restore on an existing environment (fake vLLM)."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fakedist  # noqa: E402
from gitrepo import git  # noqa: E402

from b70bench import patches, revisions, walklog  # noqa: E402
from b70bench.decode import pair  # noqa: E402
from b70bench.errors import UsageError  # noqa: E402
from b70bench.stack import description  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REL = "fakevllm/models/minimax_m2.py"
TARGET = "dist:fakevllm==0.32.0"


@pytest.fixture
def setup(tmp_path):
    wheel_dir = tmp_path / "wheel"
    wheel_dir.mkdir()
    site = fakedist.install(fakedist.build_wheel(wheel_dir), tmp_path / "site")
    repo = tmp_path / "repo"
    (repo / "patches").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "README").write_text("history without patches/ first\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "no patches yet")
    model = fakedist.MODEL
    step1 = model.replace("q + k", "k + q")
    fakedist.write_patch(repo / "patches", "01-swap.patch", TARGET, model, step1, REL)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "swap")
    step2 = step1.replace("renormalize=True", "renormalize=False")
    fakedist.write_patch(repo / "patches", "02-norm.patch", TARGET, step1, step2, REL)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "norm")
    fakedist.write_patch(repo / "patches", "03-stale.patch", TARGET, "absent\n", "present\n", REL)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "stale")
    walker = revisions.Walker(sys.executable, repo, str(site), tmp_path / "prefix")
    return walker, repo, site


def test_walk_applies_each_commits_set_and_restores(setup):
    walker, repo, site = setup
    commits = revisions.commits_in(repo, "HEAD~3..HEAD")
    assert len(commits) == 3 and commits[-1] == git(repo, "rev-parse", "HEAD")
    seen = []

    def fake_asv(cmd, env):
        # What the benchmarks would see while asv runs: the commit's patched file and the state file.
        assert cmd[-len(["--bench", "X"]) :] == ["--bench", "X"] and "--set-commit-hash" in cmd
        seen.append(
            (
                cmd[cmd.index("--set-commit-hash") + 1],
                fakedist.model_path(site).read_text(),
                patches.read_state(walker.env).get("patch_set_hash"),
            )
        )
        return 0

    rows = revisions.walk(walker, commits, ["--bench", "X"], run_benchmarks=fake_asv, out=lambda *a: None)
    assert [r["applied"] for r in rows] == [True, True, False]
    assert all(r["restored"] for r in rows)
    assert "03-stale.patch does not apply" in rows[2]["error"]
    assert [s[0] for s in seen] == commits[:2]
    assert "k + q" in seen[0][1] and "renormalize=True" in seen[0][1]
    assert "k + q" in seen[1][1] and "renormalize=False" in seen[1][1]
    assert seen[0][2] == rows[0]["patch_set_hash"] != seen[1][2] == rows[1]["patch_set_hash"]
    assert patches.verify_distribution(patches.find_distribution(walker.env, "fakevllm")) == []
    assert fakedist.model_path(site).read_text() == fakedist.MODEL


def test_commit_without_patches_dir_is_the_empty_set(setup):
    walker, repo, site = setup
    first = git(repo, "rev-list", "--max-parents=0", "HEAD")
    rows = revisions.walk(walker, [first], [], run_benchmarks=lambda cmd, env: 0, out=lambda *a: None)
    assert rows[0]["applied"] and rows[0]["patch_set_hash"] == patches.PatchSet(Path(".")).hash


def test_ctrl_c_during_benchmarks_restores(setup):
    walker, repo, site = setup
    commits = revisions.commits_in(repo, "HEAD~3..HEAD~1")

    def interrupted(cmd, env):
        assert "k + q" in fakedist.model_path(site).read_text()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        revisions.walk(walker, commits, [], run_benchmarks=interrupted, out=lambda *a: None)
    assert fakedist.model_path(site).read_text() == fakedist.MODEL
    assert patches.read_journal(walker.env) is None


def test_walk_refuses_a_patched_environment_and_one_command_restores(setup, tmp_path):
    walker, repo, site = setup
    pdir = revisions.export_patches(repo, git(repo, "rev-parse", "HEAD~1"), tmp_path / "p")
    assert walker.patches_cmd("apply", "--dir", str(pdir)).returncode == 0  # left behind by a killed walk
    with pytest.raises(UsageError, match="revisions --restore") as refused:
        revisions.walk(walker, [git(repo, "rev-parse", "HEAD")], [], run_benchmarks=lambda c, e: 0)
    # The command the refusal names, as a user would paste it: it restores this walk's --site-dir and --prefix.
    named = re.search(r"`b70bench (revisions --restore[^`]*)`", str(refused.value)).group(1).split()
    done = subprocess.run(
        [sys.executable, "-m", "b70bench", *named], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert fakedist.model_path(site).read_text() == fakedist.MODEL


HARD_KILL_DRIVER = """
import sys, time
from pathlib import Path
from b70bench import revisions
w = revisions.Walker(sys.executable, Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
def stuck(cmd, env):
    print("BENCHMARKING", flush=True)
    time.sleep(600)
revisions.walk(w, revisions.commits_in(Path(sys.argv[1]), sys.argv[4] if sys.argv[4:] else "HEAD~1"), [],
               run_benchmarks=stuck)
"""


def test_hard_kill_mid_walk_leaves_it_restorable_and_lock_refuses_second_walk(setup):
    walker, repo, site = setup
    proc = subprocess.Popen(
        [sys.executable, "-c", HARD_KILL_DRIVER, str(repo), walker.site_dir, str(walker.prefix)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "BENCHMARKING" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        assert "BENCHMARKING" in line
        # A second walk on the same environment while the first runs: refused by the lock.
        with pytest.raises(UsageError, match="is in use"):
            revisions.walk(walker, [git(repo, "rev-parse", "HEAD")], [], run_benchmarks=lambda c, e: 0)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert "renormalize=False" in fakedist.model_path(site).read_text()  # killed while patched
    assert walker.restore().returncode == 0
    assert fakedist.model_path(site).read_text() == fakedist.MODEL
    assert patches.verify_distribution(patches.find_distribution(walker.env, "fakevllm")) == []


def test_range_without_commits_is_a_usage_error(setup):
    walker, repo, site = setup
    with pytest.raises(UsageError, match="holds no commits"):
        revisions.commits_in(repo, "HEAD..HEAD")


BUILD = "python3 -c \"import kernel; open('built.txt', 'w').write(str(kernel.TILE))\""


def tree_patch(repo: Path, tree: Path, new: str, build: str = BUILD) -> None:
    p = fakedist.write_patch(repo / "patches", "tile.patch", f"tree:{tree}", "TILE = 64\n", new, "kernel.py")
    p.write_text(p.read_text().replace("\n\n---", f"\nB70bench-Build: {build}\n\n---", 1))


@pytest.fixture
def tree_history(setup, tmp_path):
    """Four commits over a source tree: a tiling (builds), a Python-only change beside it, a tiling whose build
    fails, a tiling that builds again."""
    walker, repo, site = setup
    tree = tmp_path / "scaler"
    tree.mkdir()
    (tree / "kernel.py").write_text("TILE = 64\n")
    git(tree, "init", "-q")
    git(tree, "add", ".")
    git(tree, "commit", "-qm", "base")
    subprocess.run(["git", "-C", str(repo), "rm", "-q", "patches/03-stale.patch"], check=True)
    (repo / "patches" / "series").write_text("01-swap.patch\n02-norm.patch\n")
    steps = [
        ("tile 128", "TILE = 128\n", BUILD),
        ("python only", "TILE = 128\n", BUILD),
        ("broken build", "TILE = 256\n", "echo 'kernel.c:1: error: tile' >&2; exit 2"),
        ("tile 256", "TILE = 256\n", BUILD),
    ]
    for subject, new, build in steps:
        (repo / "patches" / "series").write_text("01-swap.patch\n02-norm.patch\n")
        if subject == "python only":
            (repo / "patches" / "README").write_text("a note beside the series\n")
        tree_patch(repo, tree, new, build)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", subject)
    return walker, repo, tree, revisions.commits_in(repo, "HEAD~4..HEAD")


def test_walk_builds_tree_copies_records_a_failed_build_and_resumes(tree_history, tmp_path):
    walker, repo, tree, commits = tree_history
    before = {p.name: p.read_bytes() for p in tree.iterdir() if p.is_file()}
    seen = {}

    def fake_asv(cmd, env):
        # What asv's processes import: the commit's built copy, first on ASV_PYTHONPATH.
        first = env["ASV_PYTHONPATH"].split(os.pathsep)[0]
        seen[cmd[cmd.index("--set-commit-hash") + 1]] = (Path(first) / "built.txt").read_text()
        return 0

    record = revisions.Record(tmp_path / "results" / "box" / "b70bench-walk.jsonl", {"asv_args": []})
    rows = revisions.walk(
        walker, commits, [], run_benchmarks=fake_asv, out=lambda *a: None, record=record, builds=tmp_path / "builds"
    )
    assert [r["outcome"] for r in rows] == ["measured", "measured", "build failed", "measured"]
    assert seen == {commits[0]: "128", commits[1]: "128", commits[3]: "256"}
    assert rows[2]["build"]["tail"] == ["kernel.c:1: error: tile"] and rows[2]["asv_rc"] is None
    assert len(list((tmp_path / "builds").glob("*/.b70bench-built.json"))) == 2  # commit 2 reused commit 1's build
    assert {p.name: p.read_bytes() for p in tree.iterdir() if p.is_file()} == before
    assert walklog.failed_commits(tmp_path / "results")[commits[2]]["machine"] == "box"
    # Walked again (an interrupted walk resumed): every commit finished before is skipped.
    again = revisions.walk(
        walker,
        commits,
        [],
        run_benchmarks=lambda c, e: pytest.fail("measured twice"),
        out=lambda *a: None,
        record=record,
        builds=tmp_path / "builds",
    )
    assert all(r.get("skipped") for r in again)
    # Other asv arguments are other inputs: measured again.
    other = revisions.Record(record.file, {"asv_args": ["--bench", "Decode"]})
    assert not any(other.finished(c, r["patch_set_hash"]) for c, r in zip(commits, rows, strict=True))


def test_a_lost_measurement_is_recorded_with_its_cause_shown_and_measured_again(tree_history, tmp_path):
    """An adapter whose paired blocks all failed (an engine killed with SIGKILL, say) reports the cause and raises,
    so asv exits 2: the walk records "measurement failed" with that cause, never "measured"; the page's table lists
    it; a resumed walk measures that commit again and only it."""
    walker, _repo, _tree, commits = tree_history
    killed = commits[1]

    def fake_asv(cmd, env):
        commit = cmd[cmd.index("--set-commit-hash") + 1]
        if commit == killed:  # what benchmarks/common.lost_if_failed does in asv's benchmark process
            walklog.report_failure("decode p128n128b1", "every block failed; the last: side B: worker died (-9)", env)
            return 2
        return 0

    record = revisions.Record(tmp_path / "results" / "box" / "b70bench-walk.jsonl", {"asv_args": []})
    kw = dict(out=lambda *a: None, record=record, builds=tmp_path / "builds")
    rows = revisions.walk(walker, commits, [], run_benchmarks=fake_asv, **kw)
    assert [r["outcome"] for r in rows] == ["measured", "measurement failed", "build failed", "measured"]
    assert rows[1]["error"] == "decode p128n128b1: every block failed; the last: side B: worker died (-9)"
    failed = walklog.failed_commits(tmp_path / "results")
    assert failed[killed]["outcome"] == "measurement failed"
    from b70bench import asv_plugin

    row = asv_plugin._failed_build_row({**failed[killed], "subject": "python only"}, 8)
    assert "<b>measurement failed</b>: decode p128n128b1: every block failed" in row and "measures it again" in row
    seen = []
    again = revisions.walk(walker, commits, [], run_benchmarks=lambda c, e: seen.append(c) or 0, **kw)
    assert [c[c.index("--set-commit-hash") + 1] for c in seen] == [killed]
    assert [r["outcome"] for r in again] == ["measured", "measured", "build failed", "measured"]
    assert killed not in walklog.failed_commits(tmp_path / "results")  # measured since: withdrawn from the page


def test_shards_split_a_walk_into_independent_parts(tree_history):
    _walker, _repo, _tree, commits = tree_history
    parts = [revisions.shard(commits, f"{k}/3") for k in (1, 2, 3)]
    assert sorted(c for p in parts for c in p) == sorted(commits) and all(parts)
    assert parts[0] == [commits[0], commits[3]]
    for bad in ("0/2", "3/2", "2", "a/b"):
        with pytest.raises(UsageError, match="--shard .* write K/N"):
            revisions.shard(commits, bad)


def test_plan_names_each_commits_builds_and_runs_nothing(tree_history, tmp_path):
    walker, repo, _tree, commits = tree_history
    cmd = [sys.executable, "-m", "b70bench", "revisions", "HEAD~4..HEAD", "--plan", "--repo", str(repo)]
    cmd += ["--site-dir", walker.site_dir, "--prefix", str(walker.prefix), "--machine", "rig-a", "--shard", "1/2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("B70BENCH_")}  # the defaults' plan
    env.update(B70BENCH_CACHE=str(tmp_path / "cache"), B70BENCH_BACKEND="cpu")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan: shard 1/2 (2 of 4 commits) on machine rig-a"), lines
    assert [ln.split()[0] for ln in lines[1:3]] == [commits[0][:10], commits[2][:10]]
    assert all("scaler: to build" in ln for ln in lines[1:3]) and lines[3].startswith("builds: 2 to build")
    assert not (tmp_path / "cache").exists()  # nothing built, nothing applied
    assert patches.read_journal(walker.env) is None
    # The CPU default here: together, decode's one shape at the walk's budget, serve's levels, the total at most.
    assert lines[4].startswith("placement: together (auto: two processes of"), lines
    assert lines[5] == (
        "decode: p128n128b1, 10 min each (the default); 96 timed calls a start (the default); decides a 5.0% change "
        "(the default)"
    ), lines
    assert lines[6].startswith("  calibration: not calibrated: run `b70bench calibrate"), lines
    assert lines[7] == "serve: 1 4 16 requests, 10 min a level (B70BENCH_SERVE_BUDGET_MIN)", lines
    assert lines[8] == "starts: 6 at least a decided measurement (3 blocks of 2)", lines
    assert lines[9].startswith("time: at most ~40 min a commit") and "~1.3 h for 2 commits to measure" in lines[9]
    # A flag swept over the same commits: the plan says each commit is measured against itself, with what differs.
    done = subprocess.run(
        [*cmd, "--b-env", "VLLM_FLAG=1"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.splitlines()[1]
        == "sides: each commit with B: VLLM_FLAG=1 against A: - on the same commit (not its parent)"
    )
    # A design where two engines fit (the CPU default) is refused, with why and the fix.
    plain = [c for c in cmd if c not in ("--shard", "1/2")]
    done = subprocess.run([*plain, "--design"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "two engines of this stack fit at once" in done.stderr and done.stderr.strip().endswith("drop --design")


def test_plan_cost_follows_the_stack_the_budgets_and_the_selected_suites(tmp_path, monkeypatch):
    for name in ("B70BENCH_DECODE_SHAPES", "B70BENCH_SERVE_CONCURRENCY", "B70BENCH_SERVE_BUDGET_MIN",
                 "B70BENCH_MIN_EFFECT", "B70BENCH_DECODE_ROUNDS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("B70BENCH_DECODE_BUDGET_MIN", "70")
    rig = tmp_path / "rig.toml"
    (tmp_path / "m27").mkdir()
    rig.write_text(f'model = "{tmp_path / "m27"}"\ntp = 4\nbackend = "xpu"\nmemory_fraction = 0.9\n')
    stack = description.load(rig)
    lines = revisions.cost_lines(["--bench", "Decode"], stack, 10)
    assert lines[0].startswith("placement: alternate (auto: memory shares 0.9 + 0.9"), lines
    # Alternate: one uncounted start a side, then six blocks of two counted starts before the first look.
    assert lines[1:] == [
        "decode: p512n512b1 p512n1536b1 p512n2048b1, 70 min each (B70BENCH_DECODE_BUDGET_MIN); 96 timed calls a "
        "start (the default); decides a 5.0% change (the default)",
        f"  calibration: not calibrated: run `b70bench calibrate --stack {rig}`",
        "starts: 14 at least a decided measurement (2 fill the compile caches, then 6 blocks of 2)",
        "time: at most ~210 min a commit (+ the block under way when a budget runs out, builds, isolated suites); "
        "~35.0 h for 10 commits to measure",
    ], lines
    # A stack that states what a start and a call cost: calls for half a start, the first look and one doubling.
    monkeypatch.delenv("B70BENCH_DECODE_BUDGET_MIN")
    rig.write_text(rig.read_text() + 'shapes = ["p512n256"]\nstart_s = 240\ncall_s = 3\n')
    lines = revisions.cost_lines(["--bench", "Decode"], description.load(rig), 10)
    first_look = 2 * (240 + (40 + pair.DEFAULT_WARMUP_CALLS) * 3) * 7 / 60  # 7: one warm start a side + 6 blocks
    assert lines[1] == (
        f"decode: p512n256, {math.ceil(2 * first_look)} min each (the first look and one doubling at the stack's "
        "start 240 s and call 3 s); 40 timed calls a start (calls for half the stack's start_s (not calibrated)); "
        "decides a 5.0% change (the default)"
    ), lines
    assert revisions.cost_lines(["-b", "Serve"], stack, 1)[1].startswith("serve: 1 4 16 requests")
    assert "none selected" in revisions.cost_lines(["--bench", "AllReduce"], stack, 1)[0]
    # A budget that is not a number of minutes is the user's to fix, in one line (the CLI exits 2 on UsageError).
    for bad in ("ten", "1", "nan"):
        monkeypatch.setenv("B70BENCH_DECODE_BUDGET_MIN", bad)
        with pytest.raises(UsageError, match=f"B70BENCH_DECODE_BUDGET_MIN='{bad}': set 2 or more minutes"):
            revisions.cost_lines(["--bench", "Decode"], stack, 10)


def test_kill_9_mid_measure_of_a_tree_walk_leaves_the_tree_as_it_was(tree_history, tmp_path):
    """The tree is only read (git archive): a kill -9 while asv measures a commit leaves it byte-identical, and
    `--restore` puts the environment back."""
    walker, repo, tree, _commits = tree_history
    before = {p.name: p.read_bytes() for p in tree.iterdir() if p.is_file()}
    env = dict(os.environ, B70BENCH_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-c", HARD_KILL_DRIVER, str(repo), walker.site_dir, str(walker.prefix), "HEAD"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "BENCHMARKING" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert "BENCHMARKING" in line, proc.stderr.read() if proc.poll() is not None else "no output"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    assert {p.name: p.read_bytes() for p in tree.iterdir() if p.is_file()} == before
    assert list((tmp_path / "cache" / "builds").glob("*/built.txt"))  # the commit's copy was built, beside the tree
    assert walker.restore().returncode == 0
    assert patches.verify_distribution(patches.find_distribution(walker.env, "fakevllm")) == []


def test_an_interrupted_walk_reaps_asv_and_what_it_started(tmp_path):
    """Ctrl-C or SIGTERM during `asv run`: asv's whole process group (its benchmark processes) is ended, not
    left running beside a restored environment."""
    pidfile = tmp_path / "child.pid"
    fake_asv = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )

    def interrupt(*_):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            revisions.run_asv([sys.executable, "-c", fake_asv], dict(os.environ), tmp_path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    child = int(pidfile.read_text())
    assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text().lower()


def test_an_environment_without_b70bench_is_refused_and_builds_use_the_walked_python(tmp_path):
    """asv's benchmark processes import b70bench and asv_runner in the walked interpreter: one lacking them is refused
    in one line with the install command, even when run from this checkout. A tree's build command finds the walked
    environment's interpreter first on PATH."""
    import venv

    from b70bench.patches import trees

    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    with pytest.raises(UsageError, match=r"cannot run the benchmarks .*pip install -e .* asv_runner"):
        revisions.check_environment(str(bare / "bin" / "python"), None)
    revisions.check_environment(sys.executable, None)  # this environment has both
    fake = tmp_path / "env" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").write_text("#!/bin/sh\necho walked\n")
    (fake / "python").chmod(0o755)
    rc = trees._run("python > out.txt", tmp_path, tmp_path / "build.log", 60, str(fake / "python"))
    assert rc == 0 and (tmp_path / "out.txt").read_text() == "walked\n"
