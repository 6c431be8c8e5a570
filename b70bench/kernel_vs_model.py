"""`b70bench kernel-vs-model`: isolated kernel and collective figures beside decode, per commit.

The seeds' htile lesson: a MoE down-projection 3x faster in isolation made decode slower.
This reads asv's results (one JSON per commit and environment), orders the commits, and for
each one puts the change of every kernel/collective time figure beside the change of
seconds per output token, flagging commits where a kernel got faster and decode got slower.
Lower is better for every figure compared (asv's convention; times in seconds).

A change counts when it is at least `tolerance` and, where both commits recorded samples
(`asv run --record-samples`), when the interval of the ratio (b70bench.stats.ratio_interval, at
`level`) excludes 1 as well: decode's samples are one per fresh vLLM start, so a run-to-run
wobble of a few percent is not read as a slowdown.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from b70bench import records, state, stats, verdicts
from b70bench.errors import UsageError
from b70bench.figures import measured, measured_samples

# Time figures of the isolated suites (bandwidths read the other way round, so they are left out)...
KERNEL_RE = r"^bench_(moe_down|allreduce)\.\w+\.track_(time|latency)\b"
# ...except the anchors and stand-ins no patch to the stack moves: the torch reference and torch's
# int4 op in moe-down, torch.distributed and NCCL itself in allreduce.
EXCLUDE_RE = r"\('(reference|torch-int4|c10d|raw)'"
MODEL_RE = r"\.track_s_per_output_token$"
# Where the walk measured decode paired with each commit's parent, the same figure's verdict comes from these
# ratios and their blocks' standard errors, read by the website's own rule (verdicts.paired), not from
# comparing two commits' samples taken minutes apart.
PAIRED_FIGURE = ("track_s_per_output_token", "track_ratio_to_parent")
PAIRED_SE_FIGURE = ("track_s_per_output_token", "track_ratio_se_to_parent")
# An isolated suite is measured in one process per commit, and a commit's samples come from that one process,
# so their interval cannot see how far processes differ: moe-down's `vllm` variant on the 2-core VM spreads
# with a log sd of 0.10-0.14 between fresh processes, so two commits' readings differ by a log sd of
# ~0.15-0.18 with nothing changed. A kernel counts as faster only when its time fell to 1 / (1 + effect): 1.6x
# is 2.6-3.1 of those sds (a 25% floor, 1.2-1.5 sds, named about one unchanged commit in eight), and the
# htile case (3x) clears it.
KERNEL_EFFECT = 0.6
# ...and only when it is faster than each of the last KERNEL_WINDOW commits that had the figure: one
# process's slow reading at the commit before (vLLM's 8 B allreduce once read 5.0 us between readings of
# 2.3-3.5 us) must not turn the next commit into a kernel win.
KERNEL_WINDOW = 2
LEVEL = verdicts.LEVEL  # the website's level: one verdict per commit and figure, as there


def _series_names(name: str, params: list[list]) -> list[str]:
    """One name per parameter combination, in asv's order (itertools.product of params)."""
    if not params:
        return [name]
    import itertools

    return [f"{name}({', '.join(str(v) for v in combo)})" for combo in itertools.product(*params)]


def read_results(results_dir: Path, machine: str | None = None, warn=None) -> dict[str, dict]:
    """commit -> {"date": ms, "env": name, "figures": {series: value}, "samples": {series: [s]}}.

    A file that is not valid JSON (asv writes results in place, so a crash mid-write leaves
    half a file) is skipped with a warning naming it; nothing else is lost.
    """
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    out: dict[str, dict] = {}
    machines = [results_dir / machine] if machine else [p for p in results_dir.iterdir() if p.is_dir()]
    for mdir in machines:
        for path in sorted(mdir.glob("*.json")):
            if path.name == "machine.json":
                continue
            try:
                data = json.loads(path.read_text())
            except ValueError as err:
                warn(f"b70bench: skipping corrupted asv result file {path} ({err}); rerun that commit")
                continue
            if not isinstance(data, dict) or "commit_hash" not in data or "results" not in data:
                continue
            cols = data.get("result_columns") or ["result", "params"]
            entry = out.setdefault(
                data["commit_hash"],
                {"date": data.get("date"), "env": data.get("env_name"), "figures": {}, "samples": {}},
            )
            for name, row in data["results"].items():
                row = dict(zip(cols, row, strict=False)) if isinstance(row, list) else row
                values = row.get("result")
                values = values if isinstance(values, list) else [values]
                samples = row.get("samples") or [None] * len(values)
                names = _series_names(name, row.get("params") or [])
                for series, value, samp in zip(names, values, samples, strict=False):
                    if (value := measured(value)) is not None:
                        entry["figures"][series] = value
                        good = measured_samples(samp)
                        if good and all(x > 0 for x in good):
                            entry["samples"][series] = list(good)
    return out


def _change(value: float, samples, prev: tuple | None, tolerance: float, level: float) -> dict:
    """The figure against the previous commit that had it: ratio, interval where both have samples, verdict.

    verdict is the word (stats.SLOWER / FASTER / NO_CHANGE / UNDECIDED), text the printed verdict. A change is
    named from `tolerance` on (the floor); smaller than the larger of tolerance and stats.DEFAULT_MIN_EFFECT
    is what "no change" rules out. One value a side has no interval: named by the change itself, else undecided."""
    out = {"value": value, "ratio": None, "interval": None, "verdict": None, "text": None}
    if prev is None:
        return out
    prev_value, prev_samples = prev
    out["ratio"] = value / prev_value
    if samples and prev_samples and len(samples) >= 2 and len(prev_samples) >= 2:
        r = stats.ratio_interval(prev_samples, samples, level)
        d = r.decide(max(tolerance, stats.DEFAULT_MIN_EFFECT), tolerance)
        out["ratio"], out["interval"] = r.ratio, [r.lo, r.hi]
        out["verdict"], out["text"] = d.word, d.text
    elif word := stats.beyond_floor(out["ratio"], tolerance):  # no interval: the rule's size half alone
        out["verdict"] = out["text"] = word
    else:
        out["verdict"], out["text"] = stats.UNDECIDED, f"{stats.UNDECIDED}: one value a side, no interval"
    return out


def _paired_change(value: float, ratios: list[float], ses: list[float] | None, tolerance: float, level: float) -> dict:
    """A decode figure's change read from its paired B/A ratios to the parent, as the regressions page reads
    them (verdicts.paired: blocks with their own standard errors where recorded, so two blocks can decide)."""
    v = verdicts.paired(
        [verdicts.Point(0, "", tuple(ratios), ses=tuple(ses or ()))],
        level,
        max(tolerance, stats.DEFAULT_MIN_EFFECT),
        tolerance,
    )[0]
    return {
        "value": value,
        "ratio": v.ratio.ratio if v.ratio else None,
        "interval": [v.ratio.lo, v.ratio.hi] if v.ratio else None,
        "verdict": v.verdict,
        "text": v.text,
        "paired": True,
    }


def compare(
    results: dict[str, dict],
    kernel_re: str = KERNEL_RE,
    model_re: str = MODEL_RE,
    tolerance: float = 0.03,
    order: list[str] | None = None,
    level: float = LEVEL,
    kernel_effect: float = KERNEL_EFFECT,
    exclude_re: str = EXCLUDE_RE,
    kernel_window: int = KERNEL_WINDOW,
) -> list[dict]:
    """One row per commit: each figure's change from the previous commit that had it, and the flag.

    Kernel figures are matched on their full name (parameters included, so a path or a variant
    can be picked or excluded), decode figures on the benchmark's name. A kernel counts as faster
    only when it is faster than each of the last `kernel_window` commits that had its figure."""
    if kernel_window < 1:
        raise UsageError(f"--kernel-window {kernel_window}: pass 1 or more commits")
    commits = order or sorted(results, key=lambda c: results[c].get("date") or 0)
    rows, last = [], {}
    kernel, model = re.compile(kernel_re), re.compile(model_re)
    exclude = re.compile(exclude_re) if exclude_re else None
    for commit in commits:
        figs = (results.get(commit) or {}).get("figures", {})
        samples = (results.get(commit) or {}).get("samples", {})
        row = {"commit": commit, "kernels": {}, "model": {}, "flag": False}
        for name, value in sorted(figs.items()):
            base = name.split("(", 1)[0]
            if model.search(base):
                group, effect = "model", tolerance
            elif kernel.search(name) and not (exclude and exclude.search(name)):
                group, effect = "kernels", kernel_effect
            else:
                continue
            earlier = last.get(name, [])
            paired = samples.get(name.replace(*PAIRED_FIGURE)) if group == "model" else None
            if paired and len(paired) >= 2:
                ses = samples.get(name.replace(*PAIRED_SE_FIGURE))
                change = _paired_change(value, paired, ses, effect, level)
            else:
                change = _change(value, samples.get(name), earlier[-1] if earlier else None, effect, level)
            if group == "kernels" and change["verdict"] == stats.FASTER:
                for prev in earlier[-kernel_window:-1]:
                    if _change(value, samples.get(name), prev, effect, level)["verdict"] != stats.FASTER:
                        change["verdict"] = stats.UNDECIDED
                        change["text"] = f"{stats.UNDECIDED}: not faster than each of the last {kernel_window} commits"
                        change["not_faster_than_earlier"] = True
            row[group][name] = change
            last[name] = [*earlier, (value, samples.get(name))][-kernel_window:]
        faster = [n for n, f in row["kernels"].items() if f["verdict"] == stats.FASTER]
        slower = [n for n, f in row["model"].items() if f["verdict"] == stats.SLOWER]
        row["flag"] = bool(faster and slower)
        row["faster_kernels"], row["slower_decode"] = faster, slower
        rows.append(row)
    return rows


def _pct(change: dict) -> str:
    if change["ratio"] is None:
        return "-"
    text = f"{(change['ratio'] - 1) * 100:+.1f}%"
    if change["interval"]:
        lo, hi = change["interval"]
        text += f" [{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}]"
    return text


def format_rows(rows: list[dict]) -> str:
    table = []
    for r in rows:
        best = min(r["kernels"].items(), key=lambda kv: kv[1]["ratio"] or 1.0, default=None)
        model = next(iter(sorted(r["model"].items())), None)
        table.append(
            {
                "commit": r["commit"][:10],
                "decode_s_per_token": model[1]["value"] if model else None,
                "decode_change": _pct(model[1]) if model else "-",
                "best_kernel": best[0] if best else "-",
                "kernel_change": _pct(best[1]) if best else "-",
                "flag": "KERNEL FASTER, DECODE SLOWER" if r["flag"] else "",
            }
        )
    return records.format_table(
        table, ["commit", "decode_s_per_token", "decode_change", "best_kernel", "kernel_change", "flag"]
    )


def unavailable_reason(device) -> str | None:
    return None  # reads results; measures nothing


def run(args) -> int:
    if not 0 < args.level < 1:
        raise UsageError(f"--level {args.level} is not a probability: pass e.g. 0.99")
    results_dir = Path(args.results) if args.results else state.asv_results_dir()
    if not results_dir.is_dir():
        raise UsageError(
            f"{results_dir} holds no asv results: run `asv run` (or `make bench`) first, or pass --results DIR"
        )
    results = read_results(results_dir, args.machine)
    if not results:
        raise UsageError(f"no asv result files under {results_dir}: run the benchmarks first")
    order = None
    if args.range:
        from b70bench.revisions import commits_in

        repo = Path(args.repo) if args.repo else state.project_dir() or Path.cwd()
        order = [c for c in commits_in(repo, args.range) if c in results]
    rows = compare(
        results,
        args.kernel,
        args.model,
        args.tolerance,
        order,
        args.level,
        args.kernel_effect,
        args.exclude,
        args.kernel_window,
    )
    print(format_rows(rows))
    flagged = [r["commit"][:10] for r in rows if r["flag"]]
    if flagged:
        print(f"\nkernel faster but decode slower at: {', '.join(flagged)} (a kernel win is not a model win)")
    if args.json:
        # stdout has always carried the bare list, a file the {"records": ...} that records.read_json also reads
        records.emit_json(args.json, rows if args.json == records.STDOUT else {"records": rows})
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "kernel-vs-model",
        help="kernel/collective figures beside decode figures, per commit",
        description="Read asv results per commit and flag commits where an isolated kernel got "
        "faster while decode got slower.",
    )
    p.add_argument("range", nargs="?", help="OLD..NEW to order and limit commits (default: all, by commit date)")
    p.add_argument(
        "--results", default=None, help="asv results_dir (default: the asv project's, from its asv.conf.json)"
    )
    p.add_argument("--machine", default=None, help="asv machine name (default: all)")
    p.add_argument("--repo", default=None, help="git repository for RANGE (default: the asv project)")
    p.add_argument("--kernel", default=KERNEL_RE, help=f"regex of kernel/collective figures (default {KERNEL_RE})")
    p.add_argument("--model", default=MODEL_RE, help=f"regex of decode figures (default {MODEL_RE})")
    p.add_argument(
        "--exclude",
        default=EXCLUDE_RE,
        help=f"regex of kernel figures left out (default {EXCLUDE_RE}: anchors and stand-ins; '' keeps all)",
    )
    p.add_argument(
        "--tolerance", type=float, default=0.03, help="smallest relative change of decode counted (default 0.03)"
    )
    p.add_argument(
        "--kernel-effect",
        type=float,
        default=KERNEL_EFFECT,
        help=f"a kernel counts as faster when its time fell to 1/(1+this) or less (default "
        f"{KERNEL_EFFECT}, set by a 2-core VM's process-to-process spread; a GPU's isolated figures repeat far "
        "closer: try 0.05 there)",
    )
    p.add_argument(
        "--kernel-window",
        type=int,
        default=KERNEL_WINDOW,
        help=f"a kernel counts as faster only when faster than each of the last N commits with its figure "
        f"(default {KERNEL_WINDOW}; 1: the commit before only)",
    )
    p.add_argument(
        "--level", type=float, default=LEVEL, help=f"interval level where both commits have samples (default {LEVEL})"
    )
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON ('-' for stdout)")
    p.set_defaults(func=run)
