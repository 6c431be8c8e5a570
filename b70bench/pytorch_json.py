"""Records in vLLM's benchmark-database format (`--pytorch-json FILE`), for dashboards built for vLLM's writer.

`vllm bench latency` / `vllm bench serve` with SAVE_TO_PYTORCH_BENCHMARK_FORMAT set write `<result>.pytorch.json`:
a list of records, one per metric, `{"benchmark": {"name": "vLLM benchmark", "extra_info": {"args", "compilation_
config.mode", "optimization_level", "use_compile"}}, "model": {"name"}, "metric": {"name", "benchmark_values",
"extra_info"}}`. b70bench writes what vLLM's writer writes for the same result (tests/test_pytorch_json.py builds
vLLM's records with the installed vLLM's own function and compares them field by field):

- decode, one start = one `vllm bench latency` run: metric `latency` (seconds per timed call), extra_info
  `avg_latency` and `percentiles` (10 25 50 75 90 99);
- serve, one start's level = one `vllm bench serve` run: vLLM's twelve metrics (mean, median, std, p99 of TTFT,
  TPOT, ITL, in ms), every other figure of the result in the metric's extra_info under vLLM's names.

`args` holds vLLM's argument names for what b70bench ran (`model`, `tensor_parallel_size`, `input_len` ... for
decode; `max_concurrency`, `request_rate`, `num_prompts`, `random_input_len` ... for serve) and `device`, which
the HUD's LLM dashboard reads. `use_compile` follows vLLM's rule over `compilation_config.mode`, which is "0"
where the engine ran eager (`--enforce-eager`, `-O0`) and unknown ("") otherwise. b70bench's own figures (p90,
client CPU share, `/metrics`, gate, cache keys, fingerprint) go only into the metric's extra_info.
"""

from __future__ import annotations

import os

from b70bench import records, stats

NAME = "vLLM benchmark"
LATENCY_PERCENTILES = (10, 25, 50, 75, 90, 99)
# What `vllm bench serve` exports as metrics; everything else of its result goes to extra_info.
SERVE_METRICS = (
    *("median_ttft_ms", "mean_ttft_ms", "std_ttft_ms", "p99_ttft_ms"),
    *("mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms"),
    *("median_itl_ms", "mean_itl_ms", "std_itl_ms", "p99_itl_ms"),
)
# b70bench's level figure (seconds) -> vLLM's result name (ms): the statistics of the four latencies.
_SERVE_FIGS = {"ttft_s": "ttft", "tpot_s": "tpot", "itl_s": "itl", "e2e_s": "e2el"}
_SERVE_RATES = {
    "output_tok_per_s": "output_throughput",
    "request_per_s": "request_throughput",
    "goodput_request_per_s": "request_goodput",
    "duration_s": "duration",
    "completed": "completed",
    "failed": "failed",
}


def compilation_mode(engine_args: list[str] | None) -> str:
    """ "0" where the arguments make the engine eager, else "" (vLLM's default, compiled: not known for sure)."""
    args = [str(a) for a in engine_args or []]
    eager = "--enforce-eager" in args or "-O0" in args or any(a.startswith("-O0") for a in args)
    return "0" if eager else ""


def record(model: str, metric: str, values: list, args: dict, extra: dict) -> dict:
    """One record as vLLM's convert_to_pytorch_benchmark_format writes it."""
    mode = extra.get("compilation_config.mode", "")
    rec = {
        "benchmark": {
            "name": NAME,
            "extra_info": {
                "args": dict(args),
                "compilation_config.mode": mode,
                "optimization_level": extra.get("optimization_level", ""),
                # vLLM's rule: compiled unless the mode says 0 or the output file's name says eager.
                "use_compile": not (mode == "0" or "eager" in args.get("output_json", "")),
            },
        },
        "model": {"name": model},
        "metric": {"name": metric, "benchmark_values": list(values), "extra_info": extra},
    }
    if not rec["benchmark"]["extra_info"]["args"].get("tensor_parallel_size") and "tensor_parallel_size" in extra:
        rec["benchmark"]["extra_info"]["args"]["tensor_parallel_size"] = extra["tensor_parallel_size"]
    return rec


def _device(start: dict) -> str | None:
    """The device as the HUD reads it: the start's device name, else its fingerprint's."""
    fp = start.get("fingerprint") or {}
    return start.get("device") or fp.get("device") or fp.get("backend")


def _engine_flags(engine_args: dict | None, eager: bool | None) -> list[str]:
    """A decode start's engine arguments (vLLM's keyword names) as the command-line flags compilation_mode reads."""
    args = dict(engine_args or {})
    flags = ["--enforce-eager"] if eager or args.get("enforce_eager") else []
    compilation = args.get("compilation_config") if isinstance(args.get("compilation_config"), dict) else {}
    if args.get("optimization_level") == 0 or compilation.get("mode") == 0:
        flags.append("-O0")
    return flags


def decode_args(start: dict) -> dict:
    """A decode start's settings under `vllm bench latency`'s argument names."""
    return {
        "model": start.get("model"),
        "input_len": start.get("prompt_len"),
        "output_len": start.get("output_len"),
        "batch_size": start.get("batch"),
        "tensor_parallel_size": start.get("tp"),
        "dtype": start.get("dtype"),
        "max_model_len": start.get("max_model_len"),
        "gpu_memory_utilization": start.get("memory_fraction"),
        "enforce_eager": bool(start.get("enforce_eager")),
        "device": _device(start),
    }


def from_decode(recs: list[dict]) -> list[dict]:
    """One `latency` record per start (its timed calls, seconds); a start whose gate failed is left out."""
    out = []
    for start in recs:
        if start.get("gate") == 1:
            continue
        per_token = start.get("samples_s_per_output_token") or []
        tokens = (start.get("batch") or 1) * (start.get("output_len") or 0)
        latencies = [s * tokens for s in per_token]
        if not latencies:
            continue
        fp = start.get("fingerprint") or {}
        extra = {
            "avg_latency": sum(latencies) / len(latencies),
            "percentiles": {str(p): stats.quantile(latencies, p / 100) for p in LATENCY_PERCENTILES},
            "compilation_config.mode": compilation_mode(
                _engine_flags(start.get("engine_args"), start.get("enforce_eager"))
            ),
            # b70bench's own figures and what makes the start comparable.
            "shape": start.get("shape"),
            "gate": start.get("gate"),
            "cache_keys": start.get("cache_keys") or [],
            "patch_set_hash": fp.get("patch_set_hash"),
            "s_per_output_token": start.get("s_per_output_token"),
            "output_tok_per_s": start.get("output_tok_per_s"),
            "ttft_s": start.get("ttft_s"),
            "fingerprint": fp,
        }
        out.append(record(str(start.get("model")), "latency", latencies, decode_args(start), extra))
    return out


def serve_result(lv: dict) -> dict:
    """One level's figures under `vllm bench serve`'s result names (ms for latencies), then b70bench's own."""
    out = {vllm: lv.get(ours) for ours, vllm in _SERVE_RATES.items()}
    for ours, fig in _SERVE_FIGS.items():
        for stat in ("mean", "median", "std", "p99"):
            value = lv.get(f"{ours}_{stat}")
            out[f"{stat}_{fig}_ms"] = None if value is None else value * 1e3
    out["max_concurrency"] = lv.get("concurrency")
    out["request_rate"] = lv.get("rate", "inf")
    for ours in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):  # b70bench's p90, beside vLLM's figures
        value = lv.get(f"{ours}_p90")
        out[f"p90_{_SERVE_FIGS[ours]}_ms"] = None if value is None else value * 1e3
    for key in ("client_cpu_share", "server_cpu_share", "client_limited", "server_metrics", "p99_note"):
        out[key] = lv.get(key)
    return out


def serve_args(start: dict, lv: dict) -> dict:
    """A serve start's level under `vllm bench serve`'s argument names."""
    return {
        "model": start.get("model"),
        "backend": "vllm",
        "endpoint": "/v1/completions",
        "dataset_name": "random",
        "random_input_len": start.get("prompt_len"),
        "random_output_len": start.get("output_len"),
        "num_prompts": lv.get("requests"),
        "max_concurrency": lv.get("concurrency"),
        "request_rate": lv.get("rate", "inf"),
        "ignore_eos": True,
        "tensor_parallel_size": start.get("tp"),
        "device": _device(start),
    }


def from_serve(starts: list[dict]) -> list[dict]:
    """vLLM's twelve metric records per start and completed level; a start whose gate failed is left out."""
    out = []
    for start in starts:
        if start.get("gate") == 1:
            continue
        for lv in start.get("levels") or []:
            if not lv.get("completed"):
                continue
            result = serve_result(lv)
            extra = {k: v for k, v in result.items() if k not in SERVE_METRICS}
            extra.update(
                {
                    "compilation_config.mode": compilation_mode(start.get("server_args")),
                    "level": f"{lv['kind']}={lv[lv['kind']]}",
                    "shape": start.get("shape"),
                    "gate": start.get("gate"),
                    "cache_keys": start.get("cache_keys") or [],
                    "slo": start.get("slo") or {},
                }
            )
            args = serve_args(start, lv)
            for metric in SERVE_METRICS:
                if result.get(metric) is not None:
                    out.append(record(str(start.get("model")), metric, [result[metric]], args, extra))
    return out


def write(path: str | os.PathLike, recs: list[dict]) -> None:
    records.emit_json(path, recs)
