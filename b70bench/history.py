"""The git history that carries patch series: a range's commits, and one commit's patches/ directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

from b70bench.errors import UsageError


def git(repo: Path, *args: str, binary: bool = False):
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=120)
    if done.returncode != 0:
        raise UsageError(f"git {' '.join(args)} failed in {repo}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout if binary else done.stdout.decode().strip()


def commits_in(repo: Path, spec: str) -> list[str]:
    """Commits of a range (A..B, oldest first, first-parent) or a single commit."""
    if ".." in spec:
        out = git(repo, "rev-list", "--reverse", "--first-parent", spec)
        commits = out.split()
    else:
        commits = [git(repo, "rev-parse", "--verify", f"{spec}^{{commit}}")]
    if not commits:
        raise UsageError(f"range {spec} holds no commits: write it as OLD..NEW (OLD excluded) or name one commit")
    return commits


def export_patches(repo: Path, commit: str, dest: Path) -> Path:
    """That commit's patches/ directory, written to dest (empty when the commit has none)."""
    dest.mkdir(parents=True, exist_ok=True)
    names = git(repo, "ls-tree", "-r", "--name-only", commit, "--", "patches/").split("\n")
    for name in filter(None, names):
        target = dest / Path(name).relative_to("patches")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(git(repo, "show", f"{commit}:{name}", binary=True))
    return dest
