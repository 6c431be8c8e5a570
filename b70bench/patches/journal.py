"""Apply and restore: backups and a journal written before any target file changes, so that a crash,
a Ctrl-C or a failed build leaves an environment `restore` returns to its installed bytes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from b70bench.errors import UsageError
from b70bench.patches.installed import Env, _sha, record_hashes, sha256_file, verify_distribution
from b70bench.patches.lock import _now, env_lock
from b70bench.patches.plan import plan
from b70bench.patches.series import PatchSet
from b70bench.records import atomic_write_bytes


def _write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def read_journal(env: Env) -> dict | None:
    try:
        return json.loads(env.journal_file.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise UsageError(
            f"journal {env.journal_file} is unreadable (it is written atomically, so it was "
            f"edited by hand): restore the target from its fix command and delete {env.work}"
        ) from None


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
        raise UsageError(
            f"build command for {target['root']} failed (exit {done.returncode}) after {when}: "
            f"fix the build, then run it by hand in that directory: {target['build']}"
        )


def apply(ps: PatchSet, env: Env, commit: str | None = None) -> dict:
    """Apply ps to env after checking everything; returns the state written. Idempotent for the same set."""
    with env_lock(env, f"patches apply {ps.directory}"):
        journal = read_journal(env)
        if journal is not None:
            if journal.get("phase") == "applied" and journal.get("patch_set_hash") == ps.hash and not _drift(journal):
                return read_state(env)
            raise UsageError(_busy_message(env, journal))
        changes = plan(ps, env)
        tree = next((ch.resolved for ch in changes if ch.resolved.editable), None)
        if tree is not None:
            raise UsageError(
                f"{tree.target.name} in {env.prefix} is an editable install from {tree.root}, and b70bench never "
                f"writes into a source tree: `compare` and `revisions` measure its patches through an overlay "
                f"(`patches apply --overlay-dir DIR` writes one). Nothing was changed"
            )
        shutil.rmtree(env.work / "backup", ignore_errors=True)  # left by a crash before any file changed
        backup = env.work / "backup"
        backup.mkdir(parents=True)
        entries = []
        for i, ch in enumerate(changes):
            st = ch.path.stat() if ch.original is not None else None
            entry = {
                "target": ch.resolved.target.label,
                "root": str(ch.resolved.root),
                "rel": ch.rel,
                "path": str(ch.path),
                "patches": ch.patches,
                "orig_sha256": _sha(ch.original),
                "new_sha256": _sha(ch.patched),
                "mode": st.st_mode & 0o7777 if st else None,
                "mtime_ns": st.st_mtime_ns if st else None,
                "backup": None,
                "pycs": [],
            }
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
        journal = {
            "version": 1,
            "phase": "applying",
            "patch_set_hash": ps.hash,
            "series": str(ps.directory),
            "patches": [p.name for p in ps.patches],
            "commit": commit,
            "started_at": _now(),
            "targets": targets,
            "files": entries,
        }
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
    what = {
        "applied": f"patch set {journal.get('patch_set_hash')} ({', '.join(journal.get('patches', []))}) is applied",
        "applying": "an apply was interrupted and left files half-patched",
        "restoring": "a restore was interrupted",
    }.get(phase, f"the journal is in phase {phase!r}")
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
            raise UsageError(
                f"{env.prefix}: {', '.join(drifted)} changed after the patches were applied, so "
                f"restoring would lose those edits: keep them elsewhere, then run "
                f"`{env.restore_command()} --force` (puts back the installed bytes)"
            )
        for t in journal.get("targets", {}).values():
            _run_build(t, "restoring")
        bad = _verify_journal(env, journal)
        if bad:
            raise UsageError(
                f"{env.prefix}: after restore, {', '.join(bad)} still differ from RECORD: "
                f"reinstall the distribution (pip install --force-reinstall --no-deps NAME==VERSION)"
            )
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
