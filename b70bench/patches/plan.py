"""Check a patch set against an environment and compute every file's patched bytes, writing nothing."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from b70bench import unidiff
from b70bench.errors import UsageError
from b70bench.patches import trees
from b70bench.patches.installed import Env, _sha, find_distribution, record_hashes, source_tree
from b70bench.patches.series import PatchSet, Target
from b70bench.patches.versions import version_matches


@dataclass
class Resolved:
    target: Target
    root: Path
    version: str | None = None
    dist: object = None  # importlib.metadata.Distribution for dist targets
    editable: bool = False  # a dist target installed editable from a git tree: root is that tree, never written

    def fix_command(self) -> str:
        if self.target.kind == "dist" and not self.editable:
            name = self.dist.metadata["Name"]
            return f"{sys.executable} -m pip install --force-reinstall --no-deps '{name}=={self.version}'"
        if self.editable:
            return f"commit or stash your edits of those files in {self.root} (git -C {self.root} status)"
        return f"git -C {self.root} checkout -- . (then rebuild: {self.target.build or 'no build command'})"


@dataclass
class Change:
    resolved: Resolved
    rel: str  # path inside the target root
    original: bytes | None
    patched: bytes | None
    patches: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.resolved.root / self.rel


def resolve(target: Target, env: Env, patch_name: str) -> Resolved:
    if target.kind == "dist":
        dist = find_distribution(env, target.name)
        if dist is None:
            raise UsageError(
                f"patch {patch_name} targets distribution {target.name!r}, which is not installed in "
                f"{env.prefix}: install it, or drop the patch from the series"
            )
        version = dist.version
        if not version_matches(version, target.spec):
            raise UsageError(
                f"patch {patch_name} is written for {target.name}{target.spec} but {env.prefix} has "
                f"{dist.metadata['Name']} {version}: use a patch set for {version} or install the "
                f"version the patch names"
            )
        tree = source_tree(dist)
        if tree is not None:  # built from source: RECORD knows nothing of the tree's files, git does
            return Resolved(target, tree, version, dist, editable=True)
        return Resolved(target, Path(dist.locate_file("")).resolve(), version, dist)
    root = Path(target.name)
    if not root.is_dir():
        raise UsageError(
            f"patch {patch_name} targets source tree {root}, which does not exist: clone it there "
            f"or fix the B70bench-Target line"
        )
    return Resolved(target, root)


def _pristine_problems(res: Resolved, changes: list[Change]) -> list[str]:
    """Files of one target that are not as installed (dist: RECORD; tree: git HEAD)."""
    problems = []
    if res.target.kind == "dist" and not res.editable:
        recorded = record_hashes(res.dist)
        for ch in changes:
            have = _sha(ch.original)
            if ch.rel in recorded:
                if have is None:
                    problems.append(f"{ch.rel} (missing; RECORD lists it)")
                elif have != recorded[ch.rel][0]:
                    problems.append(f"{ch.rel} (sha256 differs from RECORD)")
            elif have is not None:
                problems.append(f"{ch.rel} (not in RECORD, so it cannot be verified; a leftover of an earlier patch?)")
        return problems
    rels = [ch.rel for ch in changes]
    try:
        out = subprocess.run(
            ["git", "-C", str(res.root), "status", "--porcelain", "--", *rels],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return [f"{res.root}: cannot ask git whether the tree is pristine ({err})"]
    if out.returncode != 0:
        return [f"{res.root} is not a git checkout, so it cannot be verified pristine ({out.stderr.strip()})"]
    return [f"{line[3:]} ({line[:2].strip()} in git status)" for line in out.stdout.splitlines() if line.strip()]


def plan(ps: PatchSet, env: Env, check_pristine: bool = True, read=None) -> list[Change]:
    """Every file the set changes, with its original and patched bytes; raises UsageError if any step would fail.

    read(path) -> bytes | None gives a file's original bytes (default: what is on disk); an overlay
    built beside a patched environment reads the journal's backups instead (patches.overlay)."""
    changes: dict[Path, Change] = {}
    resolved: dict[Target, Resolved] = {}
    for patch in ps.patches:
        res = resolved.get(patch.target) or resolved.setdefault(patch.target, resolve(patch.target, env, patch.name))
        for fd in patch.files:
            path = res.root / fd.path
            if path not in changes:
                if read is not None:
                    data = read(path)
                else:
                    data = path.read_bytes() if path.exists() else None
                changes[path] = Change(res, fd.path, data, data)
    for ch in changes.values():
        if ch.resolved.editable and not trees.overlaid(ch.resolved.root, ch.rel):
            raise UsageError(
                f"patch {', '.join(p.name for p in ps.patches if any(f.path == ch.rel for f in p.files))} changes "
                f"{ch.rel} of {ch.resolved.target.name}, an editable install from {ch.resolved.root}: a file a build "
                f"reads needs a build, so target the tree instead (B70bench-Target: tree:{ch.resolved.root} with a "
                f"B70bench-Build: line, docs/source-builds.md). Nothing was changed"
            )
    if check_pristine:  # before the hunks: "your vLLM was edited" says more than "hunk 3 fails"
        for res in resolved.values():
            problems = _pristine_problems(res, [c for c in changes.values() if c.resolved is res])
            if problems:
                raise UsageError(
                    f"{res.target.label} is not pristine in {env.prefix}: {'; '.join(problems)}. "
                    f"Fix: {res.fix_command()}. Nothing was changed"
                )
    for patch in ps.patches:
        res = resolved[patch.target]
        for fd in patch.files:
            ch = changes[res.root / fd.path]
            try:
                ch.patched = unidiff.apply(ch.patched, fd)
            except unidiff.PatchError as err:
                raise UsageError(
                    f"patch {patch.name} does not apply to {res.target.label} "
                    f"({res.version or res.root}): {err}. Nothing was changed"
                ) from None
            ch.patches.append(patch.name)
    return list(changes.values())
