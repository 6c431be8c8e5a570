"""A patch series as a private copy of vLLM for one process, leaving the environment untouched.

`build(series_dir, env, dest)` writes dest/<package> as a tree of symlinks into the environment's
site-packages, with real directories only along the paths of the files the series changes, and
those files holding their patched bytes. A process started with dest first on PYTHONPATH imports
the patched package; every other process keeps importing the environment's. Two engines with
different series can therefore run at the same time, each reading only its own files for as long
as it lives (`b70bench compare` and the decode asv adapter start them side by side).

The original bytes come from the environment's journal backups where the environment itself has
a series applied (an asv environment holds the commit it measures), so an overlay is always the
installed package plus exactly its own series. A source-tree target (llm-scaler, a vLLM checkout) gets a built
copy of its own instead (patches.trees: HEAD plus the series' changes to files a build reads, built by the tree's
build command, cached), with the series' Python files placed over it in a mirror of its own (built_trees);
python_path(dest) puts that mirror, then the copies, ahead of the overlay.

A `dist:` target that is an editable install from a git tree (vLLM built from source, `pip install -e .`) is
overlaid like any distribution, from the tree the environment imports: its compiled modules are linked, its patched
Python files are the overlay's own, and the tree is only read.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from b70bench.patches import trees
from b70bench.patches.installed import Env
from b70bench.patches.journal import read_journal
from b70bench.patches.plan import plan
from b70bench.patches.series import PatchSet, load

MANIFEST = "b70bench-overlay.txt"
TREES = "b70bench-trees.txt"  # one built copy's import path per line, first on PYTHONPATH
TREE_FILES = "b70bench-tree-files"  # the mirror of the built copies with the series' Python files (not importable)


def installed_reader(env: Env):
    """path -> installed bytes (for plan(read=...)): the journal's backup where the environment's series
    changed the file, else the file."""
    return _pristine_reader(env)[0]


def _pristine_reader(env: Env):
    """(path -> installed bytes, the environment's journal): backups for files its series changed."""
    journal = read_journal(env) or {}
    backups = {e["path"]: e.get("backup") for e in journal.get("files", [])}

    def read(path: Path) -> bytes | None:
        key = str(path)
        if key in backups:
            return None if backups[key] is None else (env.work / backups[key]).read_bytes()
        return path.read_bytes() if path.exists() else None

    return read, journal


def _mirror(src: Path, dst: Path, keep: set[str]) -> None:
    """dst as a directory of symlinks to src's entries, except the names in keep (made real, by the caller)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(src):
        if entry.name in keep or entry.name == "__pycache__":
            continue
        os.symlink(entry.path, dst / entry.name)


def _place(root: Path, dest: Path, rel: str, data: bytes | None) -> None:
    """Make dest/rel hold data, turning each directory on the way into a real mirror of root's."""
    parts = Path(rel).parts
    for i in range(1, len(parts)):
        d = dest.joinpath(*parts[:i])
        if d.is_symlink():
            d.unlink()
        if not d.exists():
            _mirror(root.joinpath(*parts[:i]), d, {parts[i]})
        else:  # a real mirror already: drop the link to the next component, if any
            nxt = d / parts[i]
            if nxt.is_symlink():
                nxt.unlink()
                if i < len(parts) - 1:
                    _mirror(root.joinpath(*parts[: i + 1]), nxt, {parts[i + 1]})
    target = dest / rel
    if target.is_symlink():
        target.unlink()
    if data is not None:
        target.write_bytes(data)


def built_trees(ps_patches, dest: Path, builds: Path | None = None, **build_kw) -> list[str]:
    """Import paths, first first, for a series' source trees: dest (a mirror holding their patched Python files, if
    any), then each tree's built copy (built, or found built, in `builds`). build_kw: trees.build's out, sites,
    python. Raises trees.BuildFailed when a build fails."""
    built = [
        trees.build(tree, group, command, builds, **build_kw)
        for tree, (command, group) in trees.by_tree(ps_patches).items()
    ]
    for b in built:
        for rel, data in b.python:
            _place(b.import_root(rel), dest, rel, data)
    mirror = [str(dest)] if any(b.python for b in built) else []
    return mirror + [path for b in built for path in b.python_path()]


def build(series_dir: str | os.PathLike, env: Env, dest: str | os.PathLike, builds: Path | None = None) -> Path:
    """dest holding the installed packages a series touches, patched, and naming the built copies of the source
    trees it patches (built into the cache `builds` where not built before); returns dest for python_path().
    Raises trees.BuildFailed when a tree's build fails, UsageError when the series does not apply."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ps = load(series_dir, allow_missing=True)
    read, journal = _pristine_reader(env)
    dist_only = PatchSet(ps.directory, [p for p in ps.patches if p.target.kind == "dist"])
    changes = plan(dist_only, env, read=read)
    tree_paths = built_trees(ps.patches, dest / TREE_FILES, builds)
    (dest / TREES).write_text("".join(f"{path}\n" for path in tree_paths))
    files: dict[tuple[Path, str], bytes | None] = {}
    for ch in changes:
        files[(ch.resolved.root, ch.rel)] = ch.patched
    # Files the environment's own series changed and this one does not: their installed bytes.
    for e in journal.get("files", []):
        key = (Path(e["root"]), e["rel"])
        if key not in files:
            files[key] = read(Path(e["path"]))
    for (root, rel), data in sorted(files.items(), key=lambda kv: kv[0][1]):
        _place(root, dest, rel, data)
    (dest / MANIFEST).write_text(
        f"patch set {ps.hash}\n" + "".join(f"{rel}\n" for (_root, rel) in sorted(files, key=lambda k: k[1]))
    )
    return dest


def python_path(dest: str | os.PathLike) -> list[str]:
    """What a side's process puts first on PYTHONPATH: its trees' built copies, then its overlay."""
    dest = Path(dest)
    listed = (dest / TREES).read_text().splitlines() if (dest / TREES).exists() else []
    return [*filter(None, listed), str(dest)]
