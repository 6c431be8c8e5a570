"""Same-process A/B: the minimal torch.distributed loop (A) against the suite's own timed row (B).

    torchrun --standalone --nproc-per-node 2 scripts/device/allreduce_abab.py [--json F] [--eager-s 90 --graph-s 60]
    torchrun --standalone --nproc-per-node 2 scripts/device/allreduce_abab.py --cpu --sizes 8,6144 --rounds 3
    python3 scripts/device/allreduce_abab.py --report F.json [--nccl-tests DIR]   # the table again, from the JSON

scripts/device/allreduce_abab.sh runs it on 2 GPUs, with nccl-tests beside it, and prints the table.

Why: eager allreduces <= 1 MiB are host-bound, and separate processes of the *same* minimal loop
moved up to 1.8x between runs (docs/allreduce.md), so process-vs-process cannot show 5%.
Here A and B share one process group and run back to back per (size, mode), in alternating order
per round (AB, BA, AB, ...), so drift and position cancel; the figure is the median over rounds of
the per-round ratio B/A.
A: minimal_allreduce.py's loop: 100 back-to-back fp16 allreduces per sample on the host clock after
   synchronize (graph: one captured graph of 100 ops, replayed), per-rank median, max over ranks.
B: b70bench.comm.worker.Rank.row(size, "c10d", mode), the very function the CLI times, with the same
   100 ops per sample and samples per round (its time_us: per-rank median, max over ranks).
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(SCRIPT_DIR)))  # the repository, for b70bench
from b70bench.stats import median_ci, quantile  # noqa: E402  (plain Python: --report runs anywhere)

MODES = ("in-place", "clone", "empty-copy")  # the minimal loop has no functional mode


# -- the summary: plain Python, so --report runs anywhere --


def label(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def summarize(rounds: list[dict]) -> list[dict]:
    """One row per (graph, size, mode): medians of A and B over rounds, and the per-round ratio B/A."""
    groups: dict[tuple, list[dict]] = {}
    for r in rounds:
        groups.setdefault((r["graph"], r["size_bytes"], r["mode"]), []).append(r)
    out = []
    for (graph, size, mode), rs in groups.items():
        pairs = [r for r in rs if r["a_us"] and r["b_us"]]
        row = {
            "graph": graph,
            "size_bytes": size,
            "mode": mode,
            "rounds": len(pairs),
            "skipped": next((r["skipped"] for r in rs if r.get("skipped")), None),
        }
        if pairs:
            a, b = [r["a_us"] for r in pairs], [r["b_us"] for r in pairs]
            ratio = [r["b_us"] / r["a_us"] for r in pairs]
            by_order = {o: [r["b_us"] / r["a_us"] for r in pairs if r["order"] == o] for o in ("AB", "BA")}
            row.update(
                a_us=statistics.median(a),
                a_us_min=min(a),
                a_us_max=max(a),
                b_us=statistics.median(b),
                b_us_min=min(b),
                b_us_max=max(b),
                ratio=statistics.median(ratio),
                ratio_min=min(ratio),
                ratio_max=max(ratio),
                ratio_q1=quantile(ratio, 0.25),
                ratio_q3=quantile(ratio, 0.75),
                ratio_ci95=median_ci(ratio),
                ratio_ab=statistics.median(by_order["AB"]) if by_order["AB"] else None,
                ratio_ba=statistics.median(by_order["BA"]) if by_order["BA"] else None,
                within_5pct=abs(statistics.median(ratio) - 1) <= 0.05,
                wrong=sum(r.get("wrong") or 0 for r in rs),
            )
        out.append(row)
    return out


def nccl_columns(nccl_dir: str | None):
    """(eager, graph) size -> nccl-tests in-place us, from all_reduce_perf output in nccl_dir, or None."""
    if not nccl_dir:
        return None
    sys.path.insert(0, SCRIPT_DIR)
    from allreduce_report import nccl_in_place, nccl_tests

    return {
        g: (nccl_in_place, nccl_tests(os.path.join(nccl_dir, f)))
        for g, f in ((False, "nccl-tests.txt"), (True, "nccl-tests-graph.txt"))
    }


def table(rows: list[dict], nccl=None) -> str:
    def rng(lo, hi, nd=1):
        return f"[{lo:.{nd}f}, {hi:.{nd}f}]"

    head = [
        "how",
        "size",
        "mode",
        "rounds",
        "A minimal us: median [min, max]",
        "B suite us: median [min, max]",
        "B/A per round: median",
        "95% CI of median",
        "IQR",
        "[min, max]",
        "AB / BA rounds",
        "within 5%",
    ]
    if nccl:
        head += ["nccl-tests in-place us", "B over nccl-tests"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ["graph" if r["graph"] else "eager", label(r["size_bytes"]), r["mode"], str(r["rounds"])]
        if "ratio" not in r:
            lines.append("| " + " | ".join(cells) + f" | skipped: {r.get('skipped') or 'no rounds'} |")
            continue
        ci = r["ratio_ci95"]
        ab = "/".join("-" if r[k] is None else f"{r[k]:.3f}" for k in ("ratio_ab", "ratio_ba"))
        cells += [
            f"{r['a_us']:.1f} {rng(r['a_us_min'], r['a_us_max'])}",
            f"{r['b_us']:.1f} {rng(r['b_us_min'], r['b_us_max'])}",
            f"**{r['ratio']:.3f}**",
            rng(*ci, 3) if ci else "- (too few rounds)",
            rng(r["ratio_q1"], r["ratio_q3"], 3),
            rng(r["ratio_min"], r["ratio_max"], 3),
            ab,
            ("yes, CI too" if ci and 0.95 <= ci[0] and ci[1] <= 1.05 else "yes") if r["within_5pct"] else "**no**",
        ]
        if nccl:
            find, nt = nccl[r["graph"]]
            ref, text = find(nt, r["size_bytes"])
            cells += [text, f"{r['b_us'] / ref:.2f}x (+{r['b_us'] - ref:.1f})" if ref else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def like_for_like(rounds: list[dict], iters, repeat) -> str:
    off = {(r["b_iters"], r["b_repeat"]) for r in rounds if r.get("b_iters")} - {(iters, repeat)}
    if off:
        return f"NOTE: B ran (iters, repeat) {sorted(off)}, A ({iters}, {repeat}): not like for like"
    return f"A and B: {iters} back-to-back ops per sample, {repeat} samples per round and (size, mode)"


def report(path: str, nccl_dir: str | None) -> int:
    with open(path) as f:
        doc = json.load(f)
    fp = doc.get("fingerprint") or {}
    print(
        f"{doc.get('rounds_eager', '?')} eager / {doc.get('rounds_graph', '?')} graph rounds, "
        f"{doc.get('world_size')} ranks, {doc.get('collective')}, fp16, {fp.get('device')}, torch {fp.get('torch')}, "
        f"commit {fp.get('commit')}; us per allreduce"
    )
    print(table(doc["records"], nccl_columns(nccl_dir)))
    print(like_for_like(doc.get("rounds_raw", []), doc.get("iters"), doc.get("repeat")))
    return 0


# -- the measurement: one rank under torchrun --


def agree_max(values: list[float], device) -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def one_round(me, i: int, graph: bool, args) -> list[dict]:
    import minimal_allreduce  # beside this script (torchrun puts its directory first on sys.path)

    out = []
    order = "AB" if i % 2 == 0 else "BA"
    for size in args.sizes:
        for mode in args.modes:
            got = {}
            for who in order:
                if who == "A":
                    got["A"] = minimal_allreduce.minimal(
                        size, mode, graph, args.iters, args.repeat, me.dev.torch_device
                    )
                else:
                    got["B"] = me.row(size, "c10d", mode)
            b = got["B"]
            out.append(
                {
                    "round": i,
                    "order": order,
                    "graph": graph,
                    "size_bytes": size,
                    "mode": mode,
                    "a_us": got["A"] * 1e6,
                    "b_us": b.get("time_us"),
                    "skipped": b.get("skipped"),
                    "b_iters": b.get("iters"),
                    "b_repeat": b.get("repeat"),
                    "wrong": b.get("wrong"),
                    "b_samples_s": b.get("samples_s"),
                }
            )
    return out


def phase(me, graph: bool, budget_s: float, args) -> list[dict]:
    """Rounds until --rounds or until the next one would overrun budget_s (decided alike on every rank)."""
    me.p.graph = graph
    rows, longest, t0 = [], 0.0, time.perf_counter()
    for i in range(args.rounds):
        elapsed, longest = agree_max([time.perf_counter() - t0, longest], me.dev.torch_device)
        if i and elapsed + longest > budget_s:
            break
        r0 = time.perf_counter()
        got = one_round(me, i, graph, args)
        if graph:  # freed graph pools are only returned on demand: hand them back between rounds, untimed
            me.dev.empty_cache()
        longest = max(longest, time.perf_counter() - r0)
        rows += got
        if me.rank == 0:
            worst = max((r["b_us"] / r["a_us"] for r in got if r["b_us"]), default=float("nan"))
            print(
                f"{'graph' if graph else 'eager'} round {i} ({got[0]['order']}): {time.perf_counter() - r0:.1f} s, "
                f"largest B/A {worst:.3f}",
                flush=True,
            )
    return rows


def measure(args) -> int:
    from b70bench import records
    from b70bench.comm.launch import rank_env
    from b70bench.comm.params import Params
    from b70bench.comm.worker import Rank
    from b70bench.fingerprint import fingerprint

    env = rank_env()
    if env is None:
        raise SystemExit("one rank of an A/B run: start it with torchrun --standalone --nproc-per-node 2 (or --report)")
    rank, world, local = env
    # A budget this large keeps the row's plan at exactly iters x repeat, as the CLI's 4 s does on
    # the H200 at these sizes (its 1 s CPU default would cut iters below A's).
    p = Params(
        sizes=args.sizes,
        modes=args.modes,
        paths=["c10d"],
        backend="gloo" if args.cpu else "nccl",
        iters=args.iters,
        repeat=args.repeat,
        budget_s=3600.0,
        timeout_s=args.timeout,
    ).validate()
    me = Rank(p, rank, world, local, None, launched=False)
    me.fault.at("measure")  # B70BENCH_FAULT=rank1:die|hang, as the suite's fault tests use it
    phases = [(False, args.eager_s)]
    if args.no_graph:
        graph_skip = "--no-graph"
    elif not me.dev.has_graphs or me.dev.backend != "cuda":
        graph_skip = f"{me.collective} on {me.dev.backend} cannot capture collectives in a CUDA graph"
    else:
        graph_skip = None
        phases.append((True, args.graph_s))
    fp = fingerprint(me.dev, me.collective)
    rounds: list[dict] = []
    for graph, budget in phases:
        rounds += phase(me, graph, budget, args)
        if rank == 0 and args.json:  # after every phase: a later failure keeps what was measured
            n = {g: len({r["round"] for r in rounds if r["graph"] == g}) for g in (False, True)}
            records.write_json(
                args.json,
                [records.record("allreduce-abab", fp, **r) for r in summarize(rounds)],
                fingerprint=fp,
                world_size=world,
                collective=me.collective,
                command=sys.argv,
                iters=args.iters,
                repeat=args.repeat,
                rounds_eager=n[False],
                rounds_graph=n[True],
                graph_skipped=graph_skip,
                rounds_raw=rounds,
            )
    if rank == 0:
        print(
            f"\nA = minimal loop, B = suite's Rank.row; {world} ranks, {me.collective}, fp16, us per allreduce, "
            f"{args.iters} ops x {args.repeat} samples per round"
            + (f"; graph skipped: {graph_skip}" if graph_skip else "")
        )
        print(table(summarize(rounds)))
        print(like_for_like(rounds, args.iters, args.repeat))
    me.teardown()  # graphs released, barrier, destroy: under the suite's guard, never waited out
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU (graph skipped): to try the script anywhere")
    ap.add_argument("--sizes", default="8,6144,1M,256M", help="comma-separated, K/M/G suffixes")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=25, help="at most this many rounds per phase (default 25)")
    ap.add_argument("--eager-s", type=float, default=90.0, help="eager phase: no new round past this (default 90)")
    ap.add_argument("--graph-s", type=float, default=60.0, help="graph phase: no new round past this (default 60)")
    ap.add_argument("--no-graph", action="store_true", help="eager only")
    ap.add_argument("--iters", type=int, default=100, help="back-to-back ops per sample, A and B (default 100)")
    ap.add_argument("--repeat", type=int, default=5, help="samples per round and (size, mode), A and B (default 5)")
    ap.add_argument("--timeout", type=float, default=120.0, help="process group timeout: a hung peer fails the run")
    ap.add_argument("--json", help="write the summary records, every round and the fingerprint here")
    ap.add_argument("--report", metavar="JSON", help="print the table from a --json file; measure nothing")
    ap.add_argument("--nccl-tests", metavar="DIR", help="with --report: nccl-tests[-graph].txt from allreduce_abab.sh")
    args = ap.parse_args()
    if args.report:
        return report(args.report, args.nccl_tests)
    from b70bench.comm.params import parse_list, parse_sizes

    args.sizes = parse_sizes([args.sizes])
    args.modes = parse_list(args.modes, MODES, "mode")
    try:
        return measure(args)
    except BaseException as err:
        if isinstance(err, SystemExit):
            raise
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # skip atexit hooks: a dead peer could make c10d's wait; torchrun then stops the others


if __name__ == "__main__":
    raise SystemExit(main())
