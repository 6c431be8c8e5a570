"""`b70bench patches ...` and `python -m b70bench.patches ...`: the command-line front over the library."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from b70bench import options
from b70bench.errors import UsageError
from b70bench.patches import overlay, trees
from b70bench.patches.installed import Env
from b70bench.patches.journal import _busy_message, apply, read_journal, restore
from b70bench.patches.plan import plan, resolve
from b70bench.patches.series import DEFAULT_DIR, PatchSet, load, subset
from b70bench.patches.status import status


def _env_from_args(args) -> Env:
    site = getattr(args, "site_dir", None)
    if site:
        return Env(Path(args.prefix or site).resolve(), (str(Path(site).resolve()),))
    return Env(Path(args.prefix).resolve() if getattr(args, "prefix", None) else Path(sys.prefix))


def _reexec(args, argv: list[str]) -> int:
    """Run this command with another environment's interpreter, using this checkout of b70bench."""
    root = str(Path(__file__).resolve().parents[2])  # b70bench/patches/cli.py -> the checkout
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    return subprocess.run([args.python, "-m", "b70bench.patches", *argv], env=env).returncode


def run(args) -> int:
    if args.python:
        args.python = options.interpreter(args.python)
        argv = [args.action] + (["--dir", args.dir] if args.dir else [])
        argv += ["--allow-missing"] if args.allow_missing else []
        argv += ["--full"] if getattr(args, "full", False) else []
        argv += ["--force"] if getattr(args, "force", False) else []
        argv += ["--commit", args.commit] if getattr(args, "commit", None) else []
        argv += ["--built-trees"] if getattr(args, "built_trees", False) else []
        argv += ["--overlay-dir", args.overlay_dir] if getattr(args, "overlay_dir", None) else []
        return _reexec(args, argv)
    env = _env_from_args(args)
    site = Path(args.site_dir) if getattr(args, "site_dir", None) else Path(sysconfig.get_paths()["purelib"])
    if args.action == "restore":
        if trees.take_off_path(site):
            print(f"b70bench: built source-tree copies taken off the path of {env.prefix}")
        shutil.rmtree(env.work / "tree-files", ignore_errors=True)
        undone = restore(env, force=args.force)
        if undone is None:
            print(f"b70bench: nothing was applied in {env.prefix}")
        else:
            print(
                f"b70bench: restored {len(undone['files'])} files of patch set {undone['patch_set_hash']} "
                f"in {env.prefix} (verified against RECORD)"
            )
        return 0
    ps = load(args.dir, allow_missing=args.allow_missing)
    if args.action == "check":
        journal = read_journal(env)
        if journal is not None:
            raise UsageError(_busy_message(env, journal))
        changes = plan(ps, env)
        print(
            f"b70bench: patch set {ps.hash}: {len(ps.patches)} patches apply cleanly to pristine targets "
            f"({len(changes)} files) in {env.prefix}"
        )
        return 0
    if args.action == "apply":
        commit = args.commit or os.environ.get("ASV_COMMIT") or os.environ.get("B70BENCH_COMMIT")
        if args.built_trees:
            # Source-tree patches into built copies (never the user's tree), on this environment's path.
            # Their Python files are placed over the copies in a mirror inside the environment's patch state.
            mirror = env.work / "tree-files"
            shutil.rmtree(mirror, ignore_errors=True)
            paths = overlay.built_trees(ps.patches, mirror, sites=[site])
            if paths:
                print(f"b70bench: built copies on the path of {env.prefix}: {trees.put_on_path(paths, site)}")
            ps = PatchSet(ps.directory, [p for p in ps.patches if p.target.kind == "dist"])
        if args.overlay_dir:
            # An editable install's tree is never written: its patches become an overlay for the caller's path.
            editable = [p for p in ps.patches if p.target.kind == "dist" and resolve(p.target, env, p.name).editable]
            if editable:
                dest = Path(args.overlay_dir)
                overlay.build(subset(ps, editable, dest.with_name(dest.name + "-series")), env, dest)
                print(f"b70bench: {len(editable)} patch(es) of an editable install overlaid in {dest}")
                ps = PatchSet(ps.directory, [p for p in ps.patches if p not in editable])
        state = apply(ps, env, commit)
        print(
            f"b70bench: patch set {state['patch_set_hash']} applied ({', '.join(state['patches']) or 'empty'}) "
            f"in {env.prefix}"
        )
        return 0
    lines, ok = status(ps, env, full=args.full)
    print("\n".join(lines))
    return 0 if ok else 1


def register(sub) -> None:
    p = sub.add_parser(
        "patches",
        help="apply/restore the patch series (patches/series) to vLLM",
        description="Check, apply and restore a quilt-style patch series against installed "
        "distributions (verified by their RECORD) or source trees.",
    )
    p.add_argument("action", choices=["status", "check", "apply", "restore"])
    p.add_argument("--dir", default=None, help=f"directory holding 'series' and the diffs (default {DEFAULT_DIR})")
    p.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="act on the environment of this interpreter instead of the current one",
    )
    p.add_argument(
        "--site-dir",
        default=None,
        metavar="DIR",
        help="look for distributions only in DIR (a pip --target install); state is kept there too",
    )
    p.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    p.add_argument("--commit", default=None, help="project commit to record with the applied set (default $ASV_COMMIT)")
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="a missing --dir is the empty patch set (asv walking commits older than patches/)",
    )
    p.add_argument(
        "--built-trees",
        action="store_true",
        help="apply: source-tree patches go into built copies (cached; docs/source-builds.md) put on this "
        "environment's path, never into the tree (asv's managed environments use this)",
    )
    p.add_argument(
        "--overlay-dir",
        metavar="DIR",
        default=None,
        help="apply: patches of a distribution installed editable from a git tree go into an overlay in DIR (put it "
        "first on PYTHONPATH), never into the tree (b70bench revisions uses this)",
    )
    p.add_argument("--full", action="store_true", help="status: verify every file of the targeted distributions")
    p.add_argument("--force", action="store_true", help="restore: put back installed bytes over files edited since")
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    """`python -m b70bench.patches ACTION`: the same command without importing torch or the other suites,
    for asv's install/uninstall commands and for environments where b70bench is not installed."""
    parser = argparse.ArgumentParser(prog="python -m b70bench.patches")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    sub.choices["patches"].prog = "python -m b70bench.patches"
    args = parser.parse_args(["patches", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except UsageError as err:
        print(f"b70bench patches: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("b70bench patches: interrupted", file=sys.stderr)
        return 130
