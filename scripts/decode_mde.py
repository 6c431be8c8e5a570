"""What `b70bench compare` can resolve on this machine: slowdowns of known cost and no-op pairs, each run several times.

Each pair is the shipped series (A) against the shipped series plus one patch (B): `work:R` adds R
64x64 matrix products per decode step (b70bench.patches.synthetic.with_work; the measured ratio
calibrates it), `noop` a comment in a file vLLM never imports for this model. Every compare is a real
`run_compare` on this interpreter's environment. Prints one row per pair: the measured ratio of each
run, how often it was called slower, how often slower or faster, how often undecided (the interval still holds
a change of --min-effect; the rest ruled it out: "no change beyond X%").

    python scripts/decode_mde.py --pairs noop work:3 work:5 work:8 --repeats 2 --json mde.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from b70bench import compare, decode, revisions, stats  # noqa: E402
from b70bench.patches import synthetic  # noqa: E402


def series_for(pair: str, tmp: Path, text: str) -> Path:
    if pair == "noop":
        return synthetic.write_series(tmp / pair, {"noop.patch": synthetic.noop_patch()})
    kind, _, reps = pair.partition(":")
    if kind != "work" or not reps.isdigit():
        raise SystemExit(f"bad pair {pair!r}: write noop or work:REPS")
    return synthetic.write_series(
        tmp / pair.replace(":", "-"),
        {
            "work.patch": synthetic.diff(
                text, synthetic.with_work(text, int(reps)), f"{reps} matrix products per decode step"
            )
        },
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", nargs="+", default=["noop", "work:3", "work:5", "work:8"])
    p.add_argument("--repeats", type=int, default=2, help="compares per pair")
    p.add_argument("--starts", type=int, default=decode.DEFAULT_STARTS, help="counted starts per side")
    p.add_argument("--level", type=float, default=compare.DEFAULT_LEVEL)
    p.add_argument("--min-effect", type=float, default=compare.DEFAULT_MIN_EFFECT)
    p.add_argument("--floor", type=float, default=compare.DEFAULT_FLOOR)
    p.add_argument("--json", default=None, help="every compare's row and start figures")
    args = p.parse_args()
    text = synthetic.shipped_model_text()
    walker = revisions.Walker(sys.executable)
    runs = []
    with tempfile.TemporaryDirectory(prefix="b70bench-mde-") as tmp:
        base = synthetic.write_series(Path(tmp) / "base", {})
        dirs = {pair: series_for(pair, Path(tmp), text) for pair in args.pairs}
        # Round-robin over pairs, so drift over the hours this takes falls on every pair alike.
        for rep in range(args.repeats):
            for pair in args.pairs:
                t0 = time.monotonic()
                recs = compare.run_compare(
                    walker,
                    {"A": base, "B": dirs[pair]},
                    ["p128n128"],
                    args.starts,
                    decode.DEFAULT_ITERATIONS,
                    Path(tmp) / f"{pair}-{rep}",
                    out=lambda _l: None,
                )
                row = next(
                    r
                    for r in compare.analyse(recs, args.level, args.min_effect, args.floor)
                    if r["figure"] == "s_per_output_token"
                )
                row.update(
                    pair=pair,
                    repeat=rep,
                    wall_s=round(time.monotonic() - t0),
                    a=decode.per_start(recs["A"]),
                    b=decode.per_start(recs["B"]),
                )
                runs.append(row)
                print(
                    f"{pair:8} run {rep}: B/A {row['ratio']:.3f} [{row['lo']:.3f}, {row['hi']:.3f}] "
                    f"{row['text']} ({row['wall_s']} s)",
                    flush=True,
                )
                if args.json:
                    Path(args.json).write_text(json.dumps(runs, indent=2))
    print("\n| pair | runs | B/A per run | called slower | called slower or faster | undecided |")
    print("|---|---|---|---|---|---|")
    for pair in dict.fromkeys(args.pairs):
        mine = [r for r in runs if r["pair"] == pair]
        ratios = ", ".join(f"{r['ratio']:.3f}" for r in mine)
        slower = sum(r["verdict"] == stats.SLOWER for r in mine)
        named = sum(r["verdict"] in (stats.SLOWER, stats.FASTER) for r in mine)
        undecided = sum(r["verdict"] == stats.UNDECIDED for r in mine)
        print(
            f"| {pair} | {len(mine)} | {ratios} (median {statistics.median(r['ratio'] for r in mine):.3f}) | "
            f"{slower}/{len(mine)} | {named}/{len(mine)} | {undecided}/{len(mine)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
