"""A walk over a commit that changes the model's numbers and not its speed, where a pin exists and where none does:

    python3 scripts/numerics_walk.py WORK          (from the repository root; WORK a new folder)

WORK/repo, a copy of this project: `base` (the shipped series), then `numerics` (every attention output times 1.02:
the same work, other tokens; b70bench.patches.synthetic.with_numerics). Walked twice with `b70bench revisions
HEAD~1..HEAD --python THIS --asv-args "--bench Decode"` (this environment's vLLM patched for the walk, journaled and
restored): on the embedded default (machine `numerics-default`: the shipped pin where this CPU has one) and on
WORK/nopin.toml, the embedded model written to a folder by `stack write-model`, which nothing pins (machine
`numerics-nopin`). Then `asv publish`; WORK/summary.json holds each walk's row for the numerics commit as the page
has it. B70BENCH_DECODE_BUDGET_MIN (default 4) minutes a commit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rig_emulation import b70, child_env, copy_project, git

from b70bench.patches import synthetic


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    work = Path(argv[0]).resolve()
    repo = work / "repo"
    repo.mkdir(parents=True)
    copy_project(repo, work)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base: the shipped series")
    text = synthetic.shipped_model_text()
    patch = synthetic.diff(text, synthetic.with_numerics(text), "Every attention output times 1.02.")
    (repo / "patches" / "numerics.patch").write_text(patch)
    with open(repo / "patches" / "series", "a") as fh:
        fh.write("numerics.patch\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "numerics: every attention output times 1.02")
    commit = git(repo, "rev-parse", "HEAD").strip()
    b70(work, "write-model", "stack", "write-model", str(work / "model"))
    (work / "nopin.toml").write_text('name = "nopin"\nbackend = "cpu"\nmodel = "./model"\n')
    os.environ.setdefault("B70BENCH_DECODE_BUDGET_MIN", "4")
    walks = {}
    for machine, stack in (("numerics-default", None), ("numerics-nopin", work / "nopin.toml")):
        args = ["revisions", "HEAD~1..HEAD", "--repo", str(repo), "--python", sys.executable, "--machine", machine]
        args += ["--asv-args", "--bench Decode --show-stderr", *(["--stack", str(stack)] if stack else [])]
        t0 = time.monotonic()
        done = b70(work, machine, *args, check=False)
        walks[machine] = {"rc": done.returncode, "wall_s": round(time.monotonic() - t0)}
    pub = subprocess.run(
        [sys.executable, "-m", "asv", "publish"], cwd=repo, env=child_env(work), capture_output=True, text=True
    )
    (work / "logs" / "publish.log").write_text(pub.stdout + pub.stderr)
    page = json.loads((work / "html" / "b70bench-verdicts.json").read_text())
    rows = [v for v in page["verdicts"] if v["commit"] == commit]
    summary = {"commit": commit, "walks": walks, "publish_rc": pub.returncode, "rows": rows}
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
