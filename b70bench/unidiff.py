"""Parse and apply unified diffs in pure Python, byte-exact.

`patch` and `git` are not on every machine b70bench runs on (a fresh container, an asv
environment whose PATH holds only the env's bin), and patching vLLM must never depend on
them. Hunks are matched exactly (no fuzz): a hunk may move by an offset, but a context
line that differs is a failure, because a fuzzy match on model code is a silent bug.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_NEWLINE = b"\\ No newline at end of file"


class PatchError(Exception):
    """A diff that cannot be parsed or does not apply; the message names file and hunk."""


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[bytes] = field(default_factory=list)  # raw lines with their ' ', '-', '+' tag

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@"

    def sides(self) -> tuple[list[bytes], list[bytes]]:
        """The lines this hunk expects (old) and writes (new), line endings kept."""
        old, new = [], []
        for i, raw in enumerate(self.lines):
            tag, body = raw[:1], raw[1:]
            if i + 1 < len(self.lines) and self.lines[i + 1].startswith(NO_NEWLINE):
                body = body.rstrip(b"\n").rstrip(b"\r")
            if tag == b"\\":
                continue
            if tag in (b" ", b"-"):
                old.append(body)
            if tag in (b" ", b"+"):
                new.append(body)
        return old, new


@dataclass
class FileDiff:
    old_path: str | None  # None: the file is created
    new_path: str | None  # None: the file is deleted
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path if self.new_path is not None else self.old_path


def _strip_path(raw: bytes, strip: int) -> str | None:
    name = raw.split(b"\t", 1)[0].strip().decode("utf-8")
    if name == "/dev/null":
        return None
    parts = name.split("/")
    if len(parts) <= strip:
        raise PatchError(f"path {name!r} has fewer than {strip + 1} components")
    return "/".join(parts[strip:])


def parse(text: bytes, strip: int = 1) -> list[FileDiff]:
    """The file diffs in text; anything outside them (mail headers, comments) is ignored."""
    lines = text.splitlines(keepends=True)
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            fd = FileDiff(_strip_path(line[4:], strip), _strip_path(lines[i + 1][4:], strip))
            if fd.old_path is None and fd.new_path is None:
                raise PatchError("a diff goes from /dev/null to /dev/null")
            files.append(fd)
            i += 2
            while i < len(lines) and lines[i].startswith(b"@@"):
                i = _parse_hunk(lines, i, fd)
            if not fd.hunks:
                raise PatchError(f"{fd.path}: no hunks after the file header")
            continue
        i += 1
    return files


def _parse_hunk(lines: list[bytes], i: int, fd: FileDiff) -> int:
    m = HUNK_RE.match(lines[i])
    if not m:
        raise PatchError(f"{fd.path}: malformed hunk header {lines[i].decode(errors='replace').strip()!r}")
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    hunk = Hunk(int(m.group(1)), old_len, int(m.group(3)), new_len)
    i += 1
    old_seen = new_seen = 0
    while i < len(lines) and (old_seen < old_len or new_seen < new_len):
        raw = lines[i]
        tag = raw[:1]
        if raw in (b"\n", b"\r\n"):  # some editors drop the space of an empty context line
            raw, tag = b" " + raw, b" "
        if tag == b" ":
            old_seen += 1
            new_seen += 1
        elif tag == b"-":
            old_seen += 1
        elif tag == b"+":
            new_seen += 1
        elif tag != b"\\":
            raise PatchError(f"{fd.path} {hunk.header}: unexpected line {raw[:60]!r} (hunk shorter than its header)")
        hunk.lines.append(raw)
        i += 1
    if old_seen != old_len or new_seen != new_len:
        raise PatchError(f"{fd.path} {hunk.header}: hunk is truncated")
    while i < len(lines) and lines[i].startswith(NO_NEWLINE):
        hunk.lines.append(lines[i])
        i += 1
    fd.hunks.append(hunk)
    return i


def apply(original: bytes | None, fd: FileDiff) -> bytes | None:
    """original with fd's hunks applied; None in and out stand for a missing file."""
    if fd.old_path is None:
        if original is not None:
            raise PatchError(f"{fd.path}: the patch creates this file but it already exists")
        src: list[bytes] = []
    elif original is None:
        # GNU patch also creates a file from a diff whose only hunk is "-0,0" (difflib writes no /dev/null).
        if not all(h.old_len == 0 and h.old_start == 0 for h in fd.hunks):
            raise PatchError(f"{fd.path}: file to patch does not exist")
        src = []
    else:
        src = original.splitlines(keepends=True)
    out: list[bytes] = []
    pos = 0  # next source line not yet copied
    delta = 0  # offset at which the previous hunk was found; later hunks start looking there
    for n, hunk in enumerate(fd.hunks, 1):
        old, new = hunk.sides()
        # A zero-length old side is anchored after line old_start, else at old_start.
        want = hunk.old_start - 1 + delta if old else hunk.old_start + delta
        at = _find(src, old, max(want, 0), pos)
        if at is None:
            raise PatchError(
                f"{fd.path}: hunk {n} {hunk.header} does not apply "
                f"(its context is not in the file: patched already, or written for another version)"
            )
        out.extend(src[pos:at])
        out.extend(new)
        pos = at + len(old)
        delta = at - (hunk.old_start - 1 if old else hunk.old_start)
    out.extend(src[pos:])
    result = b"".join(out)
    if fd.new_path is None:
        if result:
            raise PatchError(f"{fd.path}: the patch deletes this file but it has content the patch does not remove")
        return None
    return result


def _find(src: list[bytes], old: list[bytes], want: int, lo: int) -> int | None:
    """The start nearest to want, not before lo, where src holds old."""
    if not old:
        return min(max(want, lo), len(src))
    hi = len(src) - len(old)
    dist = 0
    while want - dist >= lo or want + dist <= hi:
        for at in (want - dist, want + dist):
            if lo <= at <= hi and src[at : at + len(old)] == old:
                return at
        dist += 1
    return None
