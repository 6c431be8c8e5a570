"""The record of a `revisions` walk, one JSON line per commit it finished, beside asv's results of that machine.

`results/asv/<machine>/b70bench-walk.jsonl` (asv reads only `*.json` there, so it leaves the file alone; it travels
with the machine's results when a sharded walk's results are gathered). A line says which commit was walked with
which inputs (patch set, asv arguments, stack) and how it ended: measured (asv's exit status) or its build failed
(the command and the build's last lines), or its measurement failed (asv's exit status and each lost measurement's
cause, as the adapters reported it). `revisions` reads it to resume an interrupted walk without measuring a
finished commit again; the website (asv_plugin) reads it to show a failed build as such.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

NAME = "b70bench-walk.jsonl"
MEASURED, BUILD_FAILED, MEASURE_FAILED = "measured", "build failed", "measurement failed"
# Set by `revisions` for asv's benchmark processes: where an adapter writes why a measurement was lost (one JSON line
# each) before it raises, so the walk's record and the page carry the cause, not only asv's exit status.
FAILURES_ENV = "B70BENCH_WALK_FAILURES"


def path(results_dir: Path, machine: str) -> Path:
    return Path(results_dir) / machine / NAME


def read(file: Path) -> list[dict]:
    """Every complete line (a line cut short by a kill is skipped: it was never a finished commit)."""
    try:
        text = Path(file).read_text()
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def append(file: Path, row: dict) -> None:
    """One line, flushed to disk before the walk goes on (a kill after this leaves the line whole)."""
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file, "a") as fh:
        fh.write(json.dumps(row, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def finished(rows: list[dict], inputs: dict) -> dict | None:
    """The last row for these inputs (commit, patch set, asv arguments, stack) that needs no second go: measured
    with asv exit 0, or a build that failed (the same inputs fail the same way)."""
    for row in reversed(rows):
        if all(row.get(k) == v for k, v in inputs.items()):
            if row.get("outcome") == BUILD_FAILED or (row.get("outcome") == MEASURED and row.get("asv_rc") == 0):
                return row
    return None


def failed_commits(results_dir: Path) -> dict[str, dict]:
    """commit -> its last failed-build or failed-measurement row, over every machine's record under results_dir
    (row["machine"] says which, row["outcome"] which failure); a later measured row of the same commit on that
    machine withdraws it."""
    out: dict[str, dict] = {}
    root = Path(results_dir)
    for file in sorted(root.glob(f"*/{NAME}")):
        for row in read(file):
            commit = row.get("commit")
            if row.get("outcome") in (BUILD_FAILED, MEASURE_FAILED):
                out[commit] = {**row, "machine": file.parent.name}
            elif row.get("outcome") == MEASURED and out.get(commit, {}).get("machine") == file.parent.name:
                out.pop(commit, None)
    return out


def report_failure(what: str, reason: str, environ: dict | None = None) -> None:
    """An adapter's lost measurement (no block completed, an engine killed, a start timed out): one line in the file
    FAILURES_ENV names, when a walk set it; the adapter raises afterwards, so asv records the benchmark failed."""
    target = (os.environ if environ is None else environ).get(FAILURES_ENV)
    if target:
        append(Path(target), {"what": what, "reason": reason})
