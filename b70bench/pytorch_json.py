"""Records in vLLM's benchmark-database format (`--pytorch-json FILE`), for dashboards users already run.

`vllm bench` with SAVE_TO_PYTORCH_BENCHMARK_FORMAT set writes `<result>.pytorch.json`: a list of records, one
per metric, each `{"benchmark": {"name", "extra_info"}, "model": {"name"}, "metric": {"name",
"benchmark_values", "extra_info"}}`, which PyTorch's OSS benchmark database (and the HUD's vLLM pages) ingest.
b70bench writes the same shape: one record per (shape, figure), `benchmark_values` the per-start values (one per
fresh vLLM process), and in `extra_info` what makes the figure comparable: shape, gate, compile-cache keys,
fingerprint (patch-set hash included).
"""

from __future__ import annotations

import os

from b70bench import records

# Decode figures exported (lower is better except the rates), one record each.
DECODE_METRICS = ("s_per_output_token", "s_per_output_token_median", "output_tok_per_s", "ttft_s", "latency_s")


def record(benchmark: str, model: str, metric: str, values: list[float], args: dict, extra: dict) -> dict:
    return {
        "benchmark": {
            "name": benchmark,
            "extra_info": {"args": args, "use_compile": not args.get("enforce_eager", False)},
        },
        "model": {"name": model},
        "metric": {"name": metric, "benchmark_values": list(values), "extra_info": extra},
    }


def from_decode(recs: list[dict]) -> list[dict]:
    """One record per (shape, figure) over that shape's starts; speed withheld by a failed gate is left out."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in recs):
        starts = [r for r in recs if r["shape"] == shape]
        first = starts[0]
        args = {
            k: first.get(k)
            for k in ("model", "dtype", "tp", "max_model_len", "prompt_len", "output_len", "batch", "memory_fraction")
        }
        args["tensor_parallel_size"] = first.get("tp")
        fp = first.get("fingerprint") or {}
        extra = {
            "shape": shape,
            "starts": len(starts),
            "gate": [r.get("gate") for r in starts],
            "cache_keys": sorted({k for r in starts for k in r.get("cache_keys") or []}),
            "patch_set_hash": fp.get("patch_set_hash"),
            "fingerprint": fp,
        }
        for metric in DECODE_METRICS:
            values = [r[metric] for r in starts if r.get(metric) is not None]
            if values:
                out.append(record("b70bench decode", str(first.get("model")), metric, values, args, extra))
    return out


def from_serve(starts: list[dict]) -> list[dict]:
    """One record per (level, figure) over the starts that completed the level, for each figure vLLM's
    database has a name for (serve.suite.LEVEL_FIGURES); failed gates left out."""
    from b70bench.serve.suite import LEVEL_FIGURES

    out = []
    kept = [s for s in starts if s.get("gate") != 1]
    if not kept:
        return out
    first = kept[0]
    levels = list(dict.fromkeys((lv["kind"], lv[lv["kind"]]) for s in kept for lv in s["levels"]))
    for kind, value in levels:
        done = [lv for s in kept for lv in s["levels"] if (lv["kind"], lv[lv["kind"]]) == (kind, value)]
        done = [lv for lv in done if lv.get("completed")]
        args = {"shape": first.get("shape"), "server_args": first.get("server_args"), kind: value}
        extra = {
            "level": f"{kind}={value}",
            "starts": len(done),
            "gate": [s.get("gate") for s in kept],
            "cache_keys": sorted({k for s in kept for k in s.get("cache_keys") or []}),
            "slo": first.get("slo") or {},
        }
        for _fig, metric, key, scale in LEVEL_FIGURES:
            if metric is None:
                continue
            values = [lv[key] * scale for lv in done if lv.get(key) is not None]
            if values:
                out.append(record("b70bench serve", str(first.get("model")), metric, values, args, extra))
    return out


def write(path: str | os.PathLike, recs: list[dict]) -> None:
    records.emit_json(path, recs)
