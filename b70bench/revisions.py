"""`b70bench revisions RANGE --python PATH`: walk commits on an environment asv cannot build.

A locally built vLLM on XPU, an existing CUDA environment: asv's managed environments cannot
reproduce them, and `environment_type: existing` cannot walk a range. This does it: for each
commit (oldest first) apply that commit's patches/ series to the environment of PATH, run
`asv run -E existing:PATH --set-commit-hash SHA`, restore, go on. The environment is locked
for the whole walk. A Ctrl-C restores before exiting; after a hard kill,
`b70bench revisions --restore --python PATH` returns the environment to its installed bytes.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from b70bench import patches
from b70bench.errors import UsageError
from b70bench.stack import description

ROOT = Path(__file__).resolve().parent.parent


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


def env_prefix(python: str) -> Path:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, timeout=60
        )
    except OSError as err:
        raise UsageError(
            f"cannot run {python}: {err}: pass --python PATH to the interpreter of the environment"
        ) from None
    if out.returncode != 0:
        raise UsageError(f"{python} does not start: {out.stderr.strip()[-300:]}")
    return Path(out.stdout.strip())


@dataclass
class Walker:
    python: str
    repo: Path = ROOT
    site_dir: str | None = None  # tests: a pip --target directory instead of the env's site-packages
    prefix: Path | None = None

    def __post_init__(self):
        self.prefix = Path(self.prefix) if self.prefix else env_prefix(self.python)
        self.env = patches.Env(self.prefix, (self.site_dir,) if self.site_dir else None)

    def patches_cmd(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
        extra = ["--site-dir", self.site_dir, "--prefix", str(self.prefix)] if self.site_dir else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        if token:
            env[patches.LOCK_TOKEN_ENV] = token
        return subprocess.run(
            [self.python, "-m", "b70bench.patches", *args, *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )

    def restore(self, token: str | None = None) -> subprocess.CompletedProcess:
        return self.patches_cmd("restore", token=token)


def asv_command(python: str, commit: str, asv_args: list[str]) -> list[str]:
    # --record-samples: the decode figures keep one sample per start for b70bench's verdicts (asv_plugin).
    return [
        sys.executable,
        "-m",
        "asv",
        "run",
        "-E",
        f"existing:{python}",
        "--set-commit-hash",
        commit,
        "--record-samples",
        *asv_args,
    ]


def walk(walker: Walker, commits: list[str], asv_args: list[str], run_benchmarks=None, out=print) -> list[dict]:
    """Apply, benchmark, restore per commit; returns one row per commit. Restores on any exit."""
    run_benchmarks = run_benchmarks or (lambda cmd, env: subprocess.run(cmd, env=env, cwd=walker.repo).returncode)
    rows = []
    with (
        patches.env_lock(walker.env, f"b70bench revisions over {len(commits)} commits") as token,
        tempfile.TemporaryDirectory(prefix="b70bench-revisions-") as tmp,
    ):
        journal = patches.read_journal(walker.env)
        if journal is not None:  # inside the lock: a walk in progress is "in use", not "left patched"
            raise UsageError(
                f"{walker.prefix} already has patches applied or half-applied "
                f"({', '.join(journal.get('patches', []))}): run "
                f"`b70bench revisions --restore --python {walker.python}` first"
            )
        for i, commit in enumerate(commits, 1):
            row = {
                "commit": commit,
                "patch_set_hash": None,
                "applied": False,
                "asv_rc": None,
                "restored": False,
                "error": None,
            }
            rows.append(row)
            pdir = export_patches(walker.repo, commit, Path(tmp) / commit / "patches")
            row["patch_set_hash"] = patches.load(pdir).hash
            out(f"[{i}/{len(commits)}] {commit[:10]}: applying patch set {row['patch_set_hash']}")
            try:
                done = walker.patches_cmd("apply", "--dir", str(pdir), "--commit", commit, token=token)
                if done.returncode != 0:
                    row["error"] = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1]
                    out(f"  apply failed (nothing changed): {row['error']}")
                    continue
                row["applied"] = True
                # asv gives an existing environment no ASV_COMMIT: the adapters pair on these (benchmarks/common.py).
                env = dict(
                    os.environ,
                    B70BENCH_COMMIT=commit,
                    B70BENCH_REPO=str(walker.repo),
                    **{patches.LOCK_TOKEN_ENV: token},
                )
                cmd = asv_command(walker.python, commit, asv_args)
                out(f"  {shlex.join(cmd)}")
                row["asv_rc"] = run_benchmarks(cmd, env)
            finally:
                back = walker.restore(token)
                row["restored"] = back.returncode == 0
                if back.returncode != 0:
                    raise UsageError(
                        f"restoring {walker.prefix} after {commit[:10]} failed: "
                        f"{back.stderr.strip()}; the walk stops here"
                    )
    return rows


def check_backend(python: str, stack: description.Stack) -> None:
    """Refuse, in one line, to walk a stack on an environment that lacks its backend (a CPU build for a GPU stack)."""
    if not stack.backend or stack.backend == "cpu":
        return
    code = f"from b70bench import device; print(device.device_count({stack.backend!r}))"
    got = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=ROOT)
    count = got.stdout.strip()
    if got.returncode != 0 or not count.isdigit() or int(count) == 0:
        raise UsageError(
            f"the environment of {python} has no {stack.backend} device (a CPU build?) but stack {stack.name} names "
            f"{stack.backend}: walk with the --python of an environment built for {stack.backend}, or a CPU stack"
        )


def run(args) -> int:
    python = args.python or sys.executable
    walker = Walker(python, Path(args.repo).resolve(), args.site_dir, args.prefix)
    if args.restore:
        done = walker.restore()
        print((done.stdout + done.stderr).strip())
        return done.returncode
    if not args.range:
        raise UsageError("name a range (OLD..NEW) or a commit, or pass --restore")
    commits = commits_in(walker.repo, args.range)
    asv_args = shlex.split(args.asv_args or "")
    if args.stack:
        stack = description.load(args.stack)  # a bad file is refused before anything is applied
        check_backend(python, stack)
        os.environ[description.ENV_VAR] = stack.source  # the asv adapters read it in asv's processes
    rows = walk(walker, commits, asv_args)
    print()
    print(f"{'commit':10}  {'patch set':16}  applied  asv  restored  error")
    for r in rows:
        print(
            f"{r['commit'][:10]:10}  {r['patch_set_hash'] or '-':16}  {'yes' if r['applied'] else 'no':7}  "
            f"{'-' if r['asv_rc'] is None else r['asv_rc']:>3}  {'yes' if r['restored'] else 'no':8}  "
            f"{r['error'] or ''}"
        )
    return 0 if all(r["applied"] and r["asv_rc"] == 0 for r in rows) else 1


def register(sub) -> None:
    p = sub.add_parser(
        "revisions",
        help="walk a commit range on an existing environment (apply, asv run, restore)",
        description="For each commit of RANGE: apply its patches/ series to the environment of "
        "--python, run `asv run -E existing:PATH --set-commit-hash SHA`, restore.",
    )
    p.add_argument("range", nargs="?", help="OLD..NEW (oldest first, OLD excluded) or one commit")
    p.add_argument(
        "--python", default=None, metavar="PATH", help="interpreter of the environment to patch (default: this one)"
    )
    p.add_argument(
        "--stack",
        metavar="FILE",
        default=None,
        help="the stack under test (docs/stacks.md), passed to the asv adapters as B70BENCH_STACK",
    )
    p.add_argument("--asv-args", default="", help='extra arguments for asv run, e.g. "--bench Decode -a repeat=3"')
    p.add_argument("--restore", action="store_true", help="only restore the environment (after an interrupted walk)")
    p.add_argument(
        "--repo", default=str(ROOT), help="the git repository whose commits carry patches/ (default: this checkout)"
    )
    p.add_argument("--site-dir", default=None, help="look for distributions only in DIR (a pip --target install)")
    p.add_argument("--prefix", default=None, help="where the environment's patch state lives (with --site-dir)")
    p.set_defaults(func=run)


if __name__ == "__main__":
    from b70bench.cli import main

    raise SystemExit(main(["revisions", *sys.argv[1:]]))
