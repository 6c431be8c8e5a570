"""`b70bench summarize PATH...`: one row per vLLM log or decode record (the seeds' 06-summarize-result.sh).

Reads vLLM logs (any: this suite's, `vllm bench`'s, a server's) and this suite's JSON; a
directory is searched for *.log and *.json. Each row: output and total tok/s where the source
states them, KV-cache tokens, compile-cache directory, key(s) and load/compile state,
backend and custom-op markers, environment flags. A table, or every field with --json.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from b70bench import records
from b70bench.decode.child import RESULT_PREFIX
from b70bench.errors import UsageError
from b70bench.stack import logs

COLUMNS = [
    "source",
    "shape",
    "output_tok_per_s",
    "total_tok_per_s",
    "kv_cache_tokens",
    "cache_state",
    "cache_key",
    "gate",
    "markers",
    "env_flags",
]
# Throughput lines of `vllm bench throughput` and of the lab's own scripts.
_THROUGHPUT = re.compile(r"Throughput: [\d.]+ requests/s, ([\d.]+) total tokens/s, ([\d.]+) output tokens/s")
_RATE = r"{0}[ _]tok(?:en)?s?(?:/s|[ _]per[ _]s(?:ec)?)\s*[=:]\s*([\d.]+)|([\d.]+) {0} tok(?:en)?s?/s"
_OUT_TPS = re.compile(_RATE.format("output"), re.IGNORECASE)
_TOT_TPS = re.compile(_RATE.format("total"), re.IGNORECASE)
_SPEC = re.compile(r"^b70bench decode (\S+): (\{.*\})$")


def _last_number(pattern: re.Pattern, text: str) -> float | None:
    value = None
    for m in pattern.finditer(text):
        value = float(next(g for g in m.groups() if g))
    return value


def _from_child(text: str) -> dict:
    """Figures of a b70bench decode child log: its spec header and its one result line."""
    spec, result = None, None
    for line in text.splitlines():
        if m := _SPEC.match(line):
            spec = json.loads(m.group(2))
        i = line.find(RESULT_PREFIX)
        if i >= 0:
            try:
                result = json.loads(line[i + len(RESULT_PREFIX) :])
            except ValueError:
                result = None
    if not spec or not result or not result.get("latencies_s"):
        return {}
    lat = min(result["latencies_s"])
    out = spec["batch"] * spec["output_len"]
    total = spec["batch"] * (spec["prompt_len"] + spec["output_len"])
    return {
        "shape": f"p{spec['prompt_len']}n{spec['output_len']}b{spec['batch']}",
        "output_tok_per_s": out / lat,
        "total_tok_per_s": total / lat,
        "token_sha256": result.get("token_sha256"),
    }


def summarize_log(path: Path) -> dict:
    text = path.read_text(errors="replace")
    parsed = logs.parse(text)
    row = {
        "source": str(path),
        "kind": "log",
        "shape": None,
        "output_tok_per_s": None,
        "total_tok_per_s": None,
        **parsed,
    }
    if m := list(_THROUGHPUT.finditer(text)):
        row["total_tok_per_s"], row["output_tok_per_s"] = float(m[-1].group(1)), float(m[-1].group(2))
    else:
        row["output_tok_per_s"] = _last_number(_OUT_TPS, text)
        row["total_tok_per_s"] = _last_number(_TOT_TPS, text)
    row.update({k: v for k, v in _from_child(text).items() if v is not None})
    if parsed["kv_cache_tokens"] is None and not parsed["cache_events"] and row["output_tok_per_s"] is None:
        row["error"] = logs.failure_reason(text)
    return row


def summarize_json(path: Path) -> list[dict]:
    try:
        recs = records.read_json(path)
    except (ValueError, KeyError, TypeError) as err:
        raise UsageError(
            f"{path} is not a b70bench JSON result ({type(err).__name__}): pass a file written with --json"
        ) from None
    rows = []
    for i, rec in enumerate(r for r in recs if isinstance(r, dict) and r.get("suite") == "decode"):
        row = {"source": f"{path}#{i}", "kind": "json", **{k: v for k, v in rec.items() if k != "fingerprint"}}
        log_path = Path(rec["log_path"]) if rec.get("log_path") else None
        if log_path and log_path.exists():
            parsed = logs.parse(log_path.read_text(errors="replace"))
            row.setdefault("backends", parsed["backends"])
            row.update(custom_op_markers=parsed["custom_op_markers"], env=parsed["env"])
        rows.append(row)
    return rows


def collect(paths: list[str]) -> list[dict]:
    rows = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted([*p.rglob("*.log"), *p.rglob("*.json")])
            files = [f for f in files if not f.name.endswith(".spec.json")]
        elif p.exists():
            files = [p]
        else:
            raise UsageError(f"{p} does not exist: pass vLLM log files, b70bench JSON files or directories")
        for f in files:
            if f.suffix == ".json":
                try:
                    rows += summarize_json(f)
                except UsageError:
                    if p.is_dir():
                        continue  # other JSON in a directory is not ours; skip it quietly
                    raise
            else:
                rows.append(summarize_log(f))
    return rows


def _table_row(row: dict) -> dict:
    keys = row.get("cache_keys") or []
    markers = (row.get("backends") or []) + (row.get("custom_op_markers") or [])
    env = row.get("env") or {}
    return {
        **row,
        "cache_key": ",".join(k[:12] for k in keys) or None,
        "markers": len(markers) or None,
        "env_flags": ",".join(f"{k}={v}" for k, v in sorted(env.items()) if not k.startswith("B70BENCH_")) or None,
    }


def run(args) -> int:
    rows = collect(args.paths)
    if args.json:
        records.emit_json(args.json, {"rows": rows})
        if args.json == records.STDOUT:
            return 0
    print(records.format_table([_table_row(r) for r in rows], COLUMNS))
    for row in rows:
        marks = (row.get("backends") or []) + (row.get("custom_op_markers") or [])
        if args.verbose and marks:
            print(f"\n{row['source']}:\n  " + "\n  ".join(marks))
        if row.get("error"):
            print(f"{row['source']}: {row['error']}", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "summarize",
        help="summarize vLLM logs and decode JSON (tok/s, KV cache, cache keys)",
        description="One row per vLLM log or decode record: output/total tok/s, KV-cache tokens, "
        "compile-cache key and load/compile state, custom-op markers, env flags.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="vLLM log, b70bench JSON, or a directory of them")
    p.add_argument("-v", "--verbose", action="store_true", help="also list each source's backend/custom-op markers")
    p.add_argument("--json", metavar="FILE", default=None, help="write all fields as JSON to FILE ('-' for stdout)")
    p.set_defaults(func=run)
