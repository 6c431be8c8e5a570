"""Which use of the host probe narrows a paired verdict: the blocks of `compare` runs, four ways.

    python scripts/pair_analysis.py DIR [DIR ...]

Each DIR holds the blockNN.json files one `b70bench compare` (or one commit of the asv walk) wrote. Per DIR
and per estimator, one B/A per block and the spread of those over blocks (what the verdict's interval is
made of):
- unpaired: median of B's calls over median of A's calls in the block (what separate starts would give);
- paired: median over rounds of B/A of the two adjacent calls (what b70bench uses);
- normalised: the same with each call divided by the host probe taken just before it;
- conditioned: paired, only rounds whose two probes are within 15% of each other (same host state).
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


if __name__ == "__main__":
    main(sys.argv[1:])
