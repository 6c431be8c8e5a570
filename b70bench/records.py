"""Records: one flat JSON object per measured row, printed as a table or written as JSON.

Figures carry their unit in the key (time_us, busbw_gbps, output_tok_per_s, ...).
JSON files are written atomically (temp file + rename) so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path


def record(suite: str, fingerprint: dict | None = None, **fields) -> dict:
    row = {"suite": suite, **fields}
    if fingerprint is not None:
        row["fingerprint"] = fingerprint
    return row


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int | None = None) -> None:
    """Write via a temp file and rename: readers see the old bytes or the new, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file 0600; a result file should read like any other the user writes.
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_directory(final: str | os.PathLike, marker: str, fill) -> Path:
    """final, made once: fill(tmp) writes a temporary sibling that is renamed into place, so a
    crash or a concurrent writer never leaves a half-written directory where a reader looks.
    `marker` is the file fill writes last; its presence means final is complete."""
    final = Path(final)
    if (final / marker).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        fill(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / marker).exists():
                raise
            # Another process finished first; its copy is identical.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


# `--json -`: stdout, not a file named "-".
STDOUT = "-"


def _json_text(obj) -> str:
    return json.dumps(obj, indent=2, default=str) + "\n"


def write_json(path: str | os.PathLike, records: list[dict], **extra) -> None:
    """{**extra, "records": records} to the file path, or to stdout when path is '-'."""
    emit_json(path, {**extra, "records": records})


def emit_json(dest: str | os.PathLike, obj) -> None:
    """obj as JSON on stdout when dest is '-', else written atomically to the file dest."""
    text = _json_text(obj)
    if str(dest) == STDOUT:
        print(text, end="")
    else:
        atomic_write_text(dest, text)


def read_json(path: str | os.PathLike) -> list[dict]:
    with open(path) as f:
        data = json.load(f)
    return data["records"] if isinstance(data, dict) else data


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0:
            return "0"
        mag = abs(value)
        if mag >= 1000:
            return f"{value:.0f}"
        if mag >= 100:
            return f"{value:.1f}"
        if mag >= 0.01:
            return f"{value:.3f}"
        return f"{value:.2e}"
    return str(value)


def format_table(records: list[dict], columns: list[str]) -> str:
    """nccl-tests-like fixed-width table, one row per record, right-aligned numbers."""
    rows = [[_cell(r.get(c)) for c in columns] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
