"""A night on the rig, rehearsed on this CPU with real vLLM: one engine at a time, warm starts of a minute or more, the
calibrated, then the same commits walked twice, with the allocation a stack stating start_s and call_s by hand
gets (half a start of calls, the first look and one doubling) and with the calibrated one (decode.budget).

    python3 scripts/night_rehearsal.py WORK STAGE...        (from the repository root; WORK a new or earlier folder)

Stages (`all` runs them in turn):
  setup      WORK/model (LAYERS x HIDDEN: a start of about a minute here), WORK/rig.toml (a KV cache too large for two
             engines: auto places alternate), WORK/repo: this project with the commits walked:
               base    the shipped series
               slow12  + in-graph work, REPS12 products of SIZE x SIZE a layer and step (~12% here)
               noop    + a comment in a model file never imported
               slow6   + REPS6 more products (~6% over slow12)
  calibrate  `b70bench calibrate --stack WORK/rig.toml` (STARTS a side, CALLS a start); then WORK/today/rig.toml:
             the same stack stating the calibration's warm start and call as start_s and call_s, no calibration
  plan       `revisions --plan` of RANGE with each stack (WORK/logs/plan-today.log, plan-calibrated.log)
  today      the walk with WORK/today/rig.toml (asv machine "today")
  calibrated the walk with WORK/rig.toml (asv machine "calibrated")
  aa         AA_TRIES x `compare base base --stack WORK/rig.toml` (the calibrated allocation on identical sides)
  summary    `asv publish`; WORK/summary.json: per walk and commit the verdict, interval, blocks, minutes, and the
             plan's forecast beside it; the A/A verdicts
Environment: LAYERS, HIDDEN (16, 512), KV_GIB (10), REPS12, REPS6, SIZE (8, 4, 64), STARTS, CALLS (3, 8), AA_TRIES
(3), RANGE (HEAD~3..HEAD), MIN_EFFECT (unset: the stack's default). Everything stays under WORK.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rig_emulation as rig  # noqa: E402

from b70bench.patches import synthetic  # noqa: E402

STEPS = ("base", "slow12", "noop", "slow6")
STAGES = ("setup", "calibrate", "plan", "today", "calibrated", "aa", "summary")


def setup(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    rig.copy_project(repo, work)
    shipped = synthetic.shipped_model_text()
    r12, r6, size = rig.env_int("REPS12", 8), rig.env_int("REPS6", 4), rig.env_int("SIZE", 64)
    texts = {
        "slow12": synthetic.with_graph_work(shipped, r12, size),
        "slow6": synthetic.with_graph_work(shipped, r12 + r6, size),
    }
    series = (repo / "patches" / "series").read_text()
    extra: dict[str, str] = {}
    commits = {}
    for step in STEPS:
        if step == "slow12":
            extra["graph-work.patch"] = synthetic.diff(shipped, texts["slow12"], f"In-graph work: {r12} products.")
        elif step == "noop":
            extra["noop.patch"] = synthetic.noop_patch()
        elif step == "slow6":
            extra["graph-work.patch"] = synthetic.diff(shipped, texts["slow6"], f"In-graph work: {r12 + r6} products.")
        for name, text in extra.items():
            (repo / "patches" / name).write_text(text)
        (repo / "patches" / "series").write_text(series + "".join(f"{n}\n" for n in extra))
        rig.git(repo, "add", "-A")
        rig.git(repo, "commit", "-qm", step)
        commits[step] = rig.git(repo, "rev-parse", "HEAD").strip()
    layers, hidden = rig.env_int("LAYERS", 16), rig.env_int("HIDDEN", 512)
    rig.b70(work, "write-model", "stack", "write-model", str(work / "model"), "--set", f"num_hidden_layers={layers}",
            "--set", f"hidden_size={hidden}", "--set", f"intermediate_size={hidden}")  # fmt: skip
    (work / "rig.toml").write_text(
        'name = "night-rehearsal"\nbackend = "cpu"\nmodel = "./model"\n'
        f'kv_cache_gib = {rig.env_int("KV_GIB", 10)}\nshapes = ["p64n64"]\nstart_timeout_s = 900\n'
    )
    (work / "setup.json").write_text(json.dumps({"commits": commits}, indent=2))


def calibrate(work: Path) -> None:
    starts, calls = str(rig.env_int("STARTS", 3)), str(rig.env_int("CALLS", 8))
    rig.b70(work, "calibrate", "calibrate", "--stack", str(work / "rig.toml"), "--starts", starts,
            "--calls", calls, "--out-dir", str(work / "cal"))  # fmt: skip
    cal = json.loads((work / "rig.calibration.json").read_text())
    (work / "today").mkdir(exist_ok=True)
    text = (work / "rig.toml").read_text().replace('model = "./model"', f'model = "{work / "model"}"')
    (work / "today" / "rig.toml").write_text(
        text + f"start_s = {cal['start_warm_s']:.0f}\ncall_s = {cal['call_s']:.3f}\n"
    )
    print((work / "logs" / "calibrate.log").read_text()[-2000:])


def stacks(work: Path) -> dict[str, Path]:
    return {"today": work / "today" / "rig.toml", "calibrated": work / "rig.toml"}


def walk_args(work: Path, name: str) -> list[str]:
    args = ["revisions", os.environ.get("RANGE") or "HEAD~3..HEAD", "--repo", str(work / "repo"), "--python",
            sys.executable, "--stack", str(stacks(work)[name]), "--machine", name,
            "--asv-args", "--bench Decode"]  # fmt: skip
    if os.environ.get("MIN_EFFECT"):
        args += ["--min-effect", os.environ["MIN_EFFECT"]]
    return args


def plan(work: Path) -> None:
    for name in stacks(work):
        rig.b70(work, f"plan-{name}", *walk_args(work, name), "--plan")
        print((work / "logs" / f"plan-{name}.log").read_text())


def walk(work: Path, name: str) -> None:
    # asv runs the adapters from the walked repository's folder: this checkout's, whatever the repository's copy was.
    shutil.copytree(rig.ROOT / "benchmarks", work / "repo" / "benchmarks", dirs_exist_ok=True)
    t0 = time.monotonic()
    done = rig.b70(work, f"walk-{name}", *walk_args(work, name), check=False)
    walks = json.loads((work / "walks.json").read_text()) if (work / "walks.json").exists() else {}
    walks[name] = {"rc": done.returncode, "wall_s": round(time.monotonic() - t0)}
    (work / "walks.json").write_text(json.dumps(walks, indent=2))


def aa(work: Path) -> None:
    base = json.loads((work / "setup.json").read_text())["commits"]["base"]
    for i in range(rig.env_int("AA_TRIES", 3)):
        rig.b70(work, f"aa{i}", "compare", base, base, "--repo", str(work / "repo"), "--stack", str(work / "rig.toml"),
                "--json", str(work / f"aa{i}.json"), "--out-dir", str(work / f"aa{i}"), check=False)  # fmt: skip


def summary(work: Path) -> None:
    rig.publish(work)
    names = {h: n for n, h in json.loads((work / "setup.json").read_text())["commits"].items()}
    page = json.loads((work / "html" / "b70bench-verdicts.json").read_text())
    keep = ("text", "ratio", "lo", "hi", "n", "minutes", "min_effect", "stopped")
    out: dict = {"walks": json.loads((work / "walks.json").read_text()) if (work / "walks.json").exists() else {}}
    for v in page["verdicts"]:
        if "track_s_per_output_token(" in v.get("benchmark", ""):
            out.setdefault(v.get("machine"), {})[names.get(v["commit"], v["commit"][:10])] = {k: v.get(k) for k in keep}
    for name in stacks(work):
        log = work / "logs" / f"plan-{name}.log"
        out.setdefault("plans", {})[name] = (
            [x for x in log.read_text().splitlines() if "min" in x] if log.exists() else []
        )
    out["aa"] = []
    for f in sorted(work.glob("aa*.json")):
        r = json.loads(f.read_text())
        res = r.get("results", [r])[0] if isinstance(r, dict) else r
        out["aa"].append(
            {k: res.get(k) for k in ("verdict", "text", "ratio", "lo", "hi", "blocks", "minutes", "starts")}
        )
    (work / "summary.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    work = Path(argv[0]).resolve()
    for stage in list(STAGES) if argv[1:] == ["all"] else argv[1:]:
        if stage == "setup":
            setup(work)
        elif stage == "calibrate":
            calibrate(work)
        elif stage == "plan":
            plan(work)
        elif stage in ("today", "calibrated"):
            walk(work, stage)
        elif stage == "aa":
            aa(work)
        elif stage == "summary":
            summary(work)
        else:
            print(f"unknown stage {stage!r}: {', '.join(STAGES)} or all")
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
