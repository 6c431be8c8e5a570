"""`patches status`: what is applied, what drifted, whether the set would apply, and the fix for each."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from b70bench.errors import UsageError
from b70bench.patches.installed import Env, find_distribution, sha256_file, verify_distribution
from b70bench.patches.journal import _busy_message, _drift, _is_pyc_of, read_journal
from b70bench.patches.plan import plan
from b70bench.patches.series import PatchSet


def status(ps: PatchSet | None, env: Env, full: bool = False) -> tuple[list[str], bool]:
    """Report lines and whether the environment is consistent (pristine, or exactly the applied set)."""
    lines = [f"environment  {env.prefix}"]
    ok = True
    journal = read_journal(env)
    if journal is not None:
        phase = journal.get("phase")
        lines.append(
            f"journal      {phase}: patch set {journal.get('patch_set_hash')} "
            f"({', '.join(journal.get('patches', [])) or 'empty'}), commit {journal.get('commit') or '-'}"
        )
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
            lines.append(
                f"RECORD       {label} {dist.version}: "
                f"{'all files as installed' if not problems else str(len(problems)) + ' files differ'}"
            )
            if problems:
                ok = False
                lines += [f"  {rel} ({why})" for rel, why in problems[:20]]
                lines.append(
                    f"fix          {sys.executable} -m pip install --force-reinstall --no-deps "
                    f"'{dist.metadata['Name']}=={dist.version}'"
                )
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
