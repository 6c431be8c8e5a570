"""One walk measured both ways at the same budget: each commit against its parent on its own (the per-pair walk:
compare's verdict per pair) and the range as one design (`revisions --design`'s measurement: each commit started
once a pass, every start serving both neighbours' verdicts). Prints each commit's two verdicts and what each way
cost in starts and minutes; --json keeps it all.

    python scripts/bisect_history.py REPO --commits 6 --branch-at 2 --slow-at 4 --reps 24
    python scripts/walk_both_ways.py HEAD~6 HEAD --repo REPO --budget 2.5 --rounds 32 --json both.json

GOOD BAD and the options are `b70bench bisect`'s (its parser): --budget is minutes a pair, and the design gets the
same minutes for all its pairs together; both use compare's rule (--level, --min-effect, --floor, first look) and
the placement `auto` picks. The per-pair walk runs first, then the design; --design-only skips the per-pair walk
(an A/A chain of identical commits, say, to see how each position of a pass reads).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from b70bench import bisect, history, pairing, walkdesign  # noqa: E402
from b70bench.stack import model as decode_model  # noqa: E402

KEEP = ("verdict", "text", "ratio", "lo", "hi", "blocks", "starts", "minutes", "placement")


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    bisect.register(sub)
    sub.choices["bisect"].add_argument("--design-only", action="store_true", help="measure the design alone")
    args = parser.parse_args(["bisect", *sys.argv[1:]])
    repo = Path(args.repo).resolve()
    good = history.git(repo, "rev-parse", "--verify", f"{args.good}^{{commit}}")
    bad = history.git(repo, "rev-parse", "--verify", f"{args.bad}^{{commit}}")
    revs = [good, *history.commits_in(repo, f"{good}..{bad}")]
    subjects = {c: history.git(repo, "log", "-1", "--format=%s", c) for c in revs}
    pre = pairing.prepare(args)
    out_dir = decode_model.cache_root() / "walk-both-ways" / time.strftime("%Y%m%dT%H%M%S")
    print(f"{len(revs) - 1} commits, {pre.stack.describe()}, placement {pre.where}, budget {args.budget:g} min a pair")

    per_pair, t0 = {}, time.monotonic()
    for a, b in zip(revs, revs[1:], strict=False):
        if args.design_only:
            break
        res, _labels = pairing.measure(args, pre, a, b, out_dir / f"pair-{b[:10]}", say=False)
        per_pair[b] = {k: res.get(k) for k in KEEP}
        print(f"  per pair  {subjects[b]:<24} {res['text']} ({res['blocks']} blocks, {res['minutes']:.1f} min)")
    pair_min = (time.monotonic() - t0) / 60

    rule = pairing.rule(args)
    rule = dataclasses.replace(rule, budget_s=rule.budget_s * (len(revs) - 1))
    t0 = time.monotonic()
    got = walkdesign.measure_chain(
        repo, revs, pre.stack, pre.env, pre.python, rule, args.shape, out_dir / "design-journal",
        lambda line: print(f"    {line}", flush=True), tag=f"both-ways {args.rounds} {pre.where}", placement=pre.where,
    )  # fmt: skip
    design_min = (time.monotonic() - t0) / 60
    design = {c: {k: r.get(k) for k in KEEP} for c, r in got.items()}
    cost = next(iter(got.values()))["design"]
    for c in revs[1:]:
        print(f"  design    {subjects[c]:<24} {got[c]['text']} ({got[c]['blocks']} blocks)")

    pair_starts = sum(r["starts"] or 0 for r in per_pair.values())
    design_text = f"design: {cost['starts']} starts ({cost['passes']} passes), {design_min:.1f} min"
    if args.design_only:
        print(design_text)
    else:
        print(
            f"per pair: {pair_starts} starts, {pair_min:.1f} min; {design_text}; design/per pair: "
            f"{cost['starts'] / pair_starts:.0%} of the starts, {design_min / pair_min:.0%} of the minutes"
        )
    if args.json:
        summary = {
            "commits": {c: subjects[c] for c in revs},
            "placement": pre.where,
            "budget_min_a_pair": args.budget,
            "per_pair": {"verdicts": per_pair, "starts": pair_starts, "minutes": pair_min},
            "design": {"verdicts": design, **cost, "minutes_wall": design_min},
        }
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
