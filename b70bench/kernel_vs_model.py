"""`b70bench kernel-vs-model`: isolated kernel and collective figures beside decode, per commit.

The seeds' htile lesson: a MoE down-projection 3x faster in isolation made decode slower.
This reads asv's results (one JSON per commit and environment), orders the commits, and for
each one puts the change of every kernel/collective time figure beside the change of
seconds per output token, flagging commits where a kernel got faster and decode got slower.
Lower is better for every figure compared (asv's convention; times in seconds).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from b70bench import records
from b70bench.errors import UsageError

KERNEL_RE = r"^bench_(moe_down|moe|allreduce)\."
MODEL_RE = r"\.track_s_per_output_token$"
ROOT = Path(__file__).resolve().parent.parent


def _series_names(name: str, params: list[list]) -> list[str]:
    """One name per parameter combination, in asv's order (itertools.product of params)."""
    if not params:
        return [name]
    import itertools

    return [f"{name}({', '.join(str(v) for v in combo)})" for combo in itertools.product(*params)]


def read_results(results_dir: Path, machine: str | None = None, warn=None) -> dict[str, dict]:
    """commit -> {"date": ms, "env": name, "figures": {series: value}} from asv's result files.

    A file that is not valid JSON (asv writes results in place, so a crash mid-write leaves
    half a file) is skipped with a warning naming it; nothing else is lost.
    """
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    out: dict[str, dict] = {}
    machines = [results_dir / machine] if machine else [p for p in results_dir.iterdir() if p.is_dir()]
    for mdir in machines:
        for path in sorted(mdir.glob("*.json")):
            if path.name == "machine.json":
                continue
            try:
                data = json.loads(path.read_text())
            except ValueError as err:
                warn(f"b70bench: skipping corrupted asv result file {path} ({err}); rerun that commit")
                continue
            if not isinstance(data, dict) or "commit_hash" not in data or "results" not in data:
                continue
            cols = data.get("result_columns") or ["result", "params"]
            entry = out.setdefault(data["commit_hash"], {"date": data.get("date"), "env": data.get("env_name"),
                                                         "figures": {}})
            for name, row in data["results"].items():
                row = dict(zip(cols, row, strict=False)) if isinstance(row, list) else row
                values = row.get("result")
                values = values if isinstance(values, list) else [values]
                for series, value in zip(_series_names(name, row.get("params") or []), values, strict=False):
                    if isinstance(value, (int, float)) and not math.isnan(value):
                        entry["figures"][series] = float(value)
    return out


def compare(results: dict[str, dict], kernel_re: str = KERNEL_RE, model_re: str = MODEL_RE,
            tolerance: float = 0.03, order: list[str] | None = None) -> list[dict]:
    """One row per commit: each figure's ratio to the previous commit that had it, and the flag."""
    commits = order or sorted(results, key=lambda c: results[c].get("date") or 0)
    rows, last = [], {}
    kernel, model = re.compile(kernel_re), re.compile(model_re)
    for commit in commits:
        figs = (results.get(commit) or {}).get("figures", {})
        row = {"commit": commit, "kernels": {}, "model": {}, "flag": False}
        for name, value in sorted(figs.items()):
            base = name.split("(", 1)[0]  # match the benchmark, not its parameter values
            group = "model" if model.search(base) else "kernels" if kernel.search(base) else None
            if group is None:
                continue
            prev = last.get(name)
            row[group][name] = {"value": value, "ratio": value / prev if prev else None}
            last[name] = value
        faster = [n for n, f in row["kernels"].items() if f["ratio"] is not None and f["ratio"] < 1 - tolerance]
        slower = [n for n, f in row["model"].items() if f["ratio"] is not None and f["ratio"] > 1 + tolerance]
        row["flag"] = bool(faster and slower)
        row["faster_kernels"], row["slower_decode"] = faster, slower
        rows.append(row)
    return rows


def _pct(ratio) -> str:
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def format_rows(rows: list[dict]) -> str:
    table = []
    for r in rows:
        best = min(r["kernels"].items(), key=lambda kv: kv[1]["ratio"] or 1.0, default=None)
        model = next(iter(sorted(r["model"].items())), None)
        table.append({
            "commit": r["commit"][:10],
            "decode_s_per_token": model[1]["value"] if model else None,
            "decode_change": _pct(model[1]["ratio"]) if model else "-",
            "best_kernel": best[0] if best else "-",
            "kernel_change": _pct(best[1]["ratio"]) if best else "-",
            "flag": "KERNEL FASTER, DECODE SLOWER" if r["flag"] else "",
        })
    return records.format_table(table, ["commit", "decode_s_per_token", "decode_change", "best_kernel",
                                        "kernel_change", "flag"])


def unavailable_reason(device) -> str | None:
    return None  # reads results; measures nothing


def run(args) -> int:
    results_dir = Path(args.results)
    if not results_dir.is_dir():
        raise UsageError(f"{results_dir} holds no asv results: run `asv run` (or `make bench`) first, or pass "
                         f"--results DIR")
    results = read_results(results_dir, args.machine)
    if not results:
        raise UsageError(f"no asv result files under {results_dir}: run the benchmarks first")
    order = None
    if args.range:
        from b70bench.revisions import commits_in

        order = [c for c in commits_in(Path(args.repo), args.range) if c in results]
    rows = compare(results, args.kernel, args.model, args.tolerance, order)
    print(format_rows(rows))
    flagged = [r["commit"][:10] for r in rows if r["flag"]]
    if flagged:
        print(f"\nkernel faster but decode slower at: {', '.join(flagged)} (a kernel win is not a model win)")
    if args.json:
        # stdout has always carried the bare list, a file the {"records": ...} that records.read_json also reads
        records.emit_json(args.json, rows if args.json == records.STDOUT else {"records": rows})
    return 0


def register(sub) -> None:
    p = sub.add_parser("kernel-vs-model", help="kernel/collective figures beside decode figures, per commit",
                       description="Read asv results per commit and flag commits where an isolated kernel got "
                                   "faster while decode got slower.")
    p.add_argument("range", nargs="?", help="OLD..NEW to order and limit commits (default: all, by commit date)")
    p.add_argument("--results", default=str(ROOT / "results" / "asv"), help="asv results_dir")
    p.add_argument("--machine", default=None, help="asv machine name (default: all)")
    p.add_argument("--repo", default=str(ROOT), help="git repository for RANGE")
    p.add_argument("--kernel", default=KERNEL_RE, help=f"regex of kernel/collective figures (default {KERNEL_RE})")
    p.add_argument("--model", default=MODEL_RE, help=f"regex of decode figures (default {MODEL_RE})")
    p.add_argument("--tolerance", type=float, default=0.03, help="relative change counted as faster/slower")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON ('-' for stdout)")
    p.set_defaults(func=run)
