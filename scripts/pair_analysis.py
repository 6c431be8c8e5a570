"""Which use of the host probe narrows a paired verdict: the blocks of `compare` runs, four ways.

    python scripts/pair_analysis.py DIR [DIR ...]
    python scripts/pair_analysis.py --components DIR [DIR ...]
    python scripts/pair_analysis.py --redecide DIR [DIR ...]
    python scripts/pair_analysis.py --rules DIR [DIR ...]
    python scripts/pair_analysis.py --cores DIR [DIR ...]
    python scripts/pair_analysis.py --costs DIR [DIR ...]

Each DIR holds the blockNN.json files one `b70bench compare` wrote (its --out-dir, default
~/.cache/b70bench/compare/STAMP; also `scripts/decode_mde.py --out-dir`). Standard library and b70bench only,
no vLLM. Per DIR
and per estimator, one B/A per block and the spread of those over blocks (what the verdict's interval is
made of):
- unpaired: median of B's calls over median of A's calls in the block (what separate starts would give);
- paired: median over rounds of B/A of the two adjacent calls (what b70bench uses);
- normalised: the same with each call divided by the host probe taken just before it;
- conditioned: paired, only rounds whose two probes are within 15% of each other (same host state).

--components splits the spread of the paired B/A over blocks into what the rounds inside a block explain and
what is left between blocks (a per-process offset), pooled over every DIR, each DIR's own mean taken out:
- within: the standard deviation of one round's log B/A inside a block, and its lag-1 correlation (near 0:
  call-to-call noise that pairing cannot cancel; well above 0: drift slow enough for pairing to cancel);
- expected: what that alone gives a block's median of n rounds (1.2533 * within / sqrt(n));
- observed: the spread of the block values; between: sqrt(observed^2 - expected^2), the offset of a block.
A block of n rounds then spreads sqrt(between^2 + (1.2533 * within)^2 / n): what more rounds a block buy.

--rules DIR... (A/A runs only) resamples their blocks, 8 at a time (seeded), and decides each set the way
`compare` does (a look at 4 blocks, then at 8; each look at the per-look level of 95% or 99% over 4 looks) by
two rules: the t interval over the block values, and paired.blocks.estimate (each block with its own standard
error). B's calls multiplied by 1.03, 1.05 or 1.08 turn the same blocks into slowdowns of known size: the
share named slower is the power, at 1.00 the share named either way is the false-alarm rate.

--cores DIR... (blocks that recorded each call's core, "cpu") puts each block's B/A beside where its calls ran:
the share of rounds whose two calls ran on the same core, and the B/A of those rounds against the others.
Pinned engines (pair.engine_cpus) run every call on one core; unpinned, a side that keeps landing on the core
something else uses reads slower for the whole block.

--costs splits each block's seconds into the start (both engines launched together to the later one's ready
line: import, model, compile, gate), the timed rounds (first call sent to the last answer, pauses included) and
the rest (warm-up calls before the rounds, stopping both engines after them): what a cheaper sample has to cut.

--redecide gives each DIR's verdict again from its recorded blocks with today's block estimator
(paired.blocks.Block.ratio) and `compare`'s defaults (95% over 4 looks, min effect 5%, floor 1%), at the first
look (4 blocks) and over every block the run took: what the estimator alone changes on the same calls.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def rounds(block: dict) -> list[tuple[dict, dict]]:
    by: dict[int, dict] = {}
    for c in block["calls"]:
        by.setdefault(c["round"], {})[c["side"]] = c
    return [(r["A"], r["B"]) for _, r in sorted(by.items()) if len(r) == 2]


def estimators(block: dict) -> dict[str, float | None]:
    rs = rounds(block)
    if not rs:
        return {}
    med = lambda xs: math.exp(statistics.median(math.log(x) for x in xs)) if xs else None  # noqa: E731
    same = [(a, b) for a, b in rs if max(a["probe_s"], b["probe_s"]) / min(a["probe_s"], b["probe_s"]) < 1.15]
    return {
        "unpaired": statistics.median(b["latency_s"] for _, b in rs) / statistics.median(a["latency_s"] for a, _ in rs),
        "paired": med([b["latency_s"] / a["latency_s"] for a, b in rs]),
        "normalised": med([(b["latency_s"] / b["probe_s"]) / (a["latency_s"] / a["probe_s"]) for a, b in rs]),
        "conditioned": med([b["latency_s"] / a["latency_s"] for a, b in same]),
    }


def main(dirs: list[str]) -> None:
    print("| run | blocks | rounds | estimator | B/A (geomean) | sd over blocks | per-block values |")
    print("|---|---|---|---|---|---|---|")
    for d in dirs:
        blocks = [json.loads(p.read_text()) for p in sorted(Path(d).glob("block[0-9][0-9].json"))]
        blocks = [b for b in blocks if not b.get("error") and b.get("calls")]
        if not blocks:
            continue
        n_rounds = sum(len(rounds(b)) for b in blocks)
        for name in ("unpaired", "paired", "normalised", "conditioned"):
            vals = [v for b in blocks if (v := estimators(b).get(name))]
            logs = [math.log(v) for v in vals]
            sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
            gm = math.exp(statistics.mean(logs))
            print(
                f"| {Path(d).name} | {len(vals)} | {n_rounds} | {name} | {gm:.3f} | {sd:.1%} | "
                + ", ".join(f"{v:.3f}" for v in vals)
                + " |"
            )


def cores(dirs: list[str]) -> None:
    gm = lambda xs: math.exp(statistics.mean(math.log(x) for x in xs)) if xs else float("nan")  # noqa: E731
    print("| run | block | B/A | cores of A | cores of B | rounds on one core | B/A there | B/A elsewhere |")
    print("|---|---|---|---|---|---|---|---|")
    for d in dirs:
        for p in sorted(Path(d).glob("block[0-9][0-9].json")):
            b = json.loads(p.read_text())
            rs = [(a, y) for a, y in rounds(b) if a.get("cpu") is not None and y.get("cpu") is not None]
            if not rs:
                continue
            same = [y["latency_s"] / a["latency_s"] for a, y in rs if a["cpu"] == y["cpu"]]
            other = [y["latency_s"] / a["latency_s"] for a, y in rs if a["cpu"] != y["cpu"]]
            where = {s: sorted({c["cpu"] for c in b["calls"] if c["side"] == s}) for s in "AB"}
            print(
                f"| {Path(d).name} | {b['index']} | {b['ratio']:.3f} | {where['A']} | {where['B']} | "
                f"{len(same) / len(rs):.0%} | {gm(same):.3f} | {gm(other):.3f} |"
            )


def costs(dirs: list[str]) -> None:
    print("| run | block | seconds | start | rounds | warm-up + stop | median call s |")
    print("|---|---|---|---|---|---|---|")
    for d in dirs:
        for p in sorted(Path(d).glob("block[0-9][0-9].json")):
            b = json.loads(p.read_text())
            if not b.get("calls"):
                continue
            start = max(s.get("wall_to_ready_s") or 0.0 for s in b["starts"].values())
            last = b["calls"][-1]
            timed = last["t_s"] + last["latency_s"]
            median = statistics.median(c["latency_s"] for c in b["calls"])
            print(
                f"| {'/'.join(Path(d).parts[-2:])} | {b['index']} | {b['wall_s']:.0f} | {start:.1f} | {timed:.1f} | "
                f"{b['wall_s'] - start - timed:.1f} | {median:.3f} |"
            )


def components(dirs: list[str]) -> None:
    within, lag1, devs, sizes = [], [], [], []
    for d in dirs:
        blocks = [json.loads(p.read_text()) for p in sorted(Path(d).glob("block[0-9][0-9].json"))]
        blocks = [b for b in blocks if not b.get("error") and b.get("calls")]
        per_block = []
        for b in blocks:
            logs = [math.log(y["latency_s"] / x["latency_s"]) for x, y in rounds(b)]
            if len(logs) < 4:
                continue
            m = statistics.mean(logs)
            within += [x - m for x in logs]
            lag1 += [((x - m) * (y - m)) for x, y in zip(logs, logs[1:], strict=False)]
            per_block.append(statistics.median(logs))
            sizes.append(len(logs))
        if len(per_block) >= 2:
            mean = statistics.mean(per_block)
            devs += [(v - mean, len(per_block)) for v in per_block]
    if not devs:
        print("no directory with two or more good blocks")
        return
    sd_w = math.sqrt(sum(x * x for x in within) / len(within))
    rho = (sum(lag1) / len(lag1)) / sd_w**2
    n = statistics.median(sizes)
    # Each DIR's mean is estimated from its own k blocks: scale the pooled squares by k / (k - 1).
    obs = math.sqrt(sum(v * v * k / (k - 1) for v, k in devs) / len(devs))
    exp_ = 1.2533 * sd_w / math.sqrt(n)
    between = math.sqrt(max(0.0, obs * obs - exp_ * exp_))
    print("| dirs | blocks | rounds a block | within (1 round) | lag-1 corr | expected block sd | observed | between |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {len(dirs)} | {len(devs)} | {n:.0f} | {sd_w:.1%} | {rho:.2f} | {exp_:.1%} | {obs:.1%} | {between:.1%} |")
    print()
    print("| rounds a block | block sd (modelled) |")
    print("|---|---|")
    for r in (24, 48, 96, 192, 384):
        print(f"| {r} | {math.sqrt(between**2 + (1.2533 * sd_w) ** 2 / r):.1%} |")


def redecide(dirs: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from b70bench import stats
    from b70bench.paired import blocks as pair
    from b70bench.paired import stopping

    level = stopping.per_look_level(stopping.DEFAULT_LEVEL)
    print("| run | first look: B/A [interval] | verdict | all blocks: B/A [interval] | verdict | blocks |")
    print("|---|---|---|---|---|---|")
    for d in dirs:
        blocks = load_blocks(d)
        cells = []
        for use in (blocks[:4], blocks):
            r, dec = pair.decide(use, level, stats.DEFAULT_MIN_EFFECT, stats.DEFAULT_FLOOR)
            if r is None:
                cells += ["-", "undecided"]
                continue
            cells += [f"{r.ratio:.3f} [{r.lo:.3f}, {r.hi:.3f}]", dec.text]
        print(f"| {Path(d).name} | " + " | ".join(cells) + f" | {len(blocks)} |")


def load_blocks(d: str):
    from b70bench.paired.blocks import Block

    out = []
    for p in sorted(Path(d).glob("block[0-9][0-9].json")):
        j = json.loads(p.read_text())
        out.append(
            Block(
                j["index"],
                j.get("calls") or [],
                j.get("starts") or {},
                j["wall_s"],
                j["error"],
                j.get("placement", "together"),
                j.get("warm_starts") or {},
            )
        )
    return out


def rules(dirs: list[str], sets: int = 600, seed: int = 3) -> None:
    import random

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from b70bench import stats
    from b70bench.paired import blocks as pair
    from b70bench.paired import stopping

    pool = [b for d in dirs for b in load_blocks(d) if b.error is None and b.ratio() is not None]

    def slowed(b, factor):
        calls = [dict(c, latency_s=c["latency_s"] * (factor if c["side"] == "B" else 1.0)) for c in b.calls]
        return pair.Block(b.index, calls, b.starts, b.wall_s, b.error, b.placement)

    def t_rule(blocks, level):
        return stats.paired_interval([b.ratio() for b in blocks], level)

    print(f"{len(pool)} A/A blocks from {len(dirs)} runs, {sets} resampled sets of 8 per row")
    print("| overall level | rule | B/A | named slower | named faster | no change | undecided | mean blocks |")
    print("|---|---|---|---|---|---|---|---|")
    for overall in (0.95, 0.99):
        level = stopping.per_look_level(overall)
        for name, rule in (("t over blocks", t_rule), ("blocks with their own se", pair.estimate)):
            for factor in (1.0, 1.03, 1.05, 1.08):
                rng = random.Random(seed)
                count = {stats.SLOWER: 0, stats.FASTER: 0, stats.NO_CHANGE: 0, stats.UNDECIDED: 0}
                used = 0
                for _ in range(sets):
                    chosen = [slowed(b, factor) for b in rng.sample(pool, 8)]
                    for n in (4, 8):
                        word = rule(chosen[:n], level).decide(stats.DEFAULT_MIN_EFFECT, stats.DEFAULT_FLOOR).word
                        if word != stats.UNDECIDED or n == 8:
                            break
                    count[word] += 1
                    used += n
                share = {k: f"{v / sets:.3f}" for k, v in count.items()}
                print(
                    f"| {overall:.0%} | {name} | {factor:.2f} | {share[stats.SLOWER]} | {share[stats.FASTER]} | "
                    f"{share[stats.NO_CHANGE]} | {share[stats.UNDECIDED]} | {used / sets:.1f} |"
                )


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] in ([], ["-h"], ["--help"]):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    modes = {"--components": components, "--rules": rules, "--cores": cores, "--costs": costs, "--redecide": redecide}
    run = modes.get(argv[0], main)
    dirs = argv[1:] if argv[0] in modes else argv
    missing = [d for d in dirs if not Path(d).is_dir()]
    if not dirs or missing:
        raise SystemExit(f"pair_analysis: give directories of blockNN.json ({', '.join(missing) or 'none given'})")
    run(dirs)
