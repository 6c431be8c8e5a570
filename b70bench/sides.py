"""Sides: a commit of the project (its patches/ series) or a series directory, made runnable.

Each side gets a private patched copy of vLLM (patches.overlay), so the environment is never modified and
both sides can run at once, and a compile cache of its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from b70bench import history, patches
from b70bench.errors import UsageError
from b70bench.paired.blocks import SIDES, Settings, Side
from b70bench.stack import model as decode_model

# How far back against_parent looks for an ancestor whose series installs.
MAX_SKIPPED_PARENTS = 10


def paired_cache_dir() -> Path:
    """Where the paired sides' compile caches persist across compares and walked commits, per side."""
    return decode_model.cache_root() / "paired-vllm-cache"


def side_env(env: dict, side: Side, backend: str) -> dict:
    """A start's environment as one side's: its patched copy of vLLM first on PYTHONPATH and, on a GPU or XPU, a
    Triton cache of its own beside its vLLM cache (two revisions of a kernel must not share compiled binaries)."""
    env = dict(env)
    if side.overlay is not None:
        paths = patches.overlay.python_path(side.overlay)
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    if backend != "cpu" and side.cache_root is not None:
        env["TRITON_CACHE_DIR"] = str(Path(side.cache_root) / "triton")
    env.update({k: str(v) for k, v in side.settings.env.items()})
    for key in side.settings.unset:
        env.pop(key, None)
    return env


def resolve_side(repo: Path, spec: str, dest: Path) -> tuple[Path, str]:
    """(series directory, label): a directory holding `series`, else a commit of repo exported to dest."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "series").is_file():
            raise UsageError(f"{spec} has no 'series' file: pass a patches directory or a commit")
        return path.resolve(), str(path)
    try:
        commit = history.git(repo, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    except UsageError:
        raise UsageError(
            f"{spec!r} is neither a commit of {repo} nor a directory with a series file: "
            f"name a commit (`git log --oneline`) or a patches directory"
        ) from None
    return history.export_patches(repo, commit, dest), commit[:12]


def build_sides(
    dirs: dict[str, Path],
    env: patches.Env,
    out_dir: Path,
    cache_dir: Path | None,
    settings: dict[str, Settings] | None = None,
) -> dict[str, Side]:
    """Each side's overlay (its own patched copy of vLLM), compile cache and settings; refused in one line if a
    series does not apply, leaving no directory behind. The sides are dirs' keys: A and B, or a design's commits."""
    created = next((p for p in reversed([out_dir, *out_dir.parents]) if not p.exists()), None)
    out_dir.mkdir(parents=True, exist_ok=True)
    sides = {}
    for s in dirs:
        try:
            ov = patches.overlay.build(dirs[s], env, out_dir / f"overlay-{s}")
        except UsageError as err:
            if created is not None:  # refused before anything ran: leave no directory behind
                shutil.rmtree(created, ignore_errors=True)
            if isinstance(err, patches.trees.BuildFailed):
                raise  # its record goes to the walk's results as a failed build
            raise UsageError(f"side {s} ({dirs[s]}): {err}") from None
        own = (settings or {}).get(s) or Settings()
        # A side's settings get a cache of their own: vLLM keys its compile cache by source and its own variables,
        # not by a model file's flag, so a graph compiled with a flag on must never be loaded with it off.
        name = f"vllm-cache-{s}" + (f"-{own.digest()}" if own else "")
        sides[s] = Side(s, ov, (cache_dir or out_dir) / name, own)
    return sides


def check_usable(series_dir: Path, env: patches.Env) -> None:
    """A UsageError where a series' dist patches do not apply to the installed vLLM or its source trees do not build
    (builds are cached, so the side built from it later reuses them)."""
    ps = patches.load(series_dir, allow_missing=True)
    dist = patches.PatchSet(ps.directory, [p for p in ps.patches if p.target.kind == "dist"])
    patches.plan(dist, env, read=patches.overlay.installed_reader(env))
    for tree, (command, group) in patches.trees.by_tree(ps.patches).items():
        patches.trees.build(tree, group, command)


def _journaled(kw: dict, commit: str, parent: str, dirs: dict) -> dict:
    """kw with the walk's journal of this measurement (walkfollow.journal): under `revisions`, its finished blocks
    are recorded and a killed walk's read back; elsewhere kw as it is."""
    from b70bench import walkfollow

    journal = walkfollow.journal(commit, parent, dirs)
    return {**kw, "journal": journal} if journal is not None and "journal" not in kw else kw


def against_parent(repo: Path, commit: str, env: patches.Env, out_dir: Path, measure, **kw) -> dict:
    """measure(dirs, env, out_dir, **kw) of a commit's series (B) against its parent's (A): the walk's verdict per
    commit (measure: decode.pair.compare_series or serve.pair.compare_series).

    A parent whose series does not apply, or whose source trees do not build (a broken commit in the history), is
    skipped for the nearest first-parent ancestor whose series does; the result names the one used ("parent") and
    the skipped.
    """
    skipped = []
    with tempfile.TemporaryDirectory(prefix="b70bench-parent-") as tmp:
        dirs = {"B": history.export_patches(repo, commit, Path(tmp) / "B")}
        parent = commit
        while True:
            try:
                parent = history.git(repo, "rev-parse", "--verify", "--quiet", f"{parent}^")
            except UsageError:
                raise UsageError(
                    f"{commit[:12]} has no ancestor in {repo} whose series applies"
                    + (f" (skipped {', '.join(s[:12] for s in skipped)})" if skipped else "")
                    + ": the oldest commit of a history has nothing to be compared with"
                ) from None
            dirs["A"] = history.export_patches(repo, parent, Path(tmp) / f"A-{parent[:12]}")
            try:
                check_usable(dirs["A"], env)
                break
            except UsageError:
                skipped.append(parent)
                if len(skipped) >= MAX_SKIPPED_PARENTS:
                    raise UsageError(
                        f"the last {MAX_SKIPPED_PARENTS} ancestors of {commit[:12]} have series that do not apply: "
                        f"fix the history or walk a range that starts after them"
                    ) from None
        res = measure(dirs, env, out_dir, **_journaled(kw, commit, parent, dirs))
    res["commit"], res["parent"], res["skipped_parents"] = commit, parent, skipped
    return res


def against_self(repo: Path, commit: str, env: patches.Env, out_dir: Path, measure, settings: dict, **kw) -> dict:
    """measure() of a commit's series on both sides, each with its own settings (a flag swept over a walk's
    commits: at every commit, B's settings against A's); the result's parent is the commit itself."""
    with tempfile.TemporaryDirectory(prefix="b70bench-self-") as tmp:
        series = history.export_patches(repo, commit, Path(tmp) / "series")
        dirs = {s: series for s in SIDES}
        res = measure(dirs, env, out_dir, settings=settings, **_journaled(kw, commit, commit, dirs))
    res["commit"], res["parent"], res["skipped_parents"] = commit, commit, []
    return res
