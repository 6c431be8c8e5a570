"""Markdown tables from the outputs scripts/device/allreduce.sh writes (it runs this as its last step):

    python3 scripts/device/allreduce_report.py results/allreduce > table.md

Per size and mode, eager and CUDA graph: nccl-tests, the minimal loop and the suite's c10d and raw rows.
Standard library only, so it runs on any machine the outputs are copied to. Values: median over runs [min, max].
"""

import glob
import json
import os
import statistics
import sys

SIZES = (8, 6144, 1 << 20, 256 << 20)
MODES = ("in-place", "clone", "empty-copy", "functional")


def label(n):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def nccl_tests(path):
    """size -> (out-of-place us, busbw, in-place us, busbw) from all_reduce_perf's table."""
    rows = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return rows
    for line in lines:
        t = line.split()
        if len(t) >= 13 and t[0].isdigit() and t[2] == "half":
            rows[int(t[0])] = (float(t[5]), float(t[7]), float(t[9]), float(t[11]))
    return rows


def nccl_in_place(nt, size):
    """(value, text): nccl-tests sweeps powers of two; a size between two is shown as their range."""
    if size in nt:
        return nt[size][2], f"{nt[size][2]:.1f}"
    lo = max((s for s in nt if s < size), default=None)
    hi = min((s for s in nt if s > size), default=None)
    if lo is None or hi is None:
        return None, "-"
    a, b = nt[lo][2], nt[hi][2]
    return (a + b) / 2, f"{min(a, b):.1f}-{max(a, b):.1f} ({label(lo)}..{label(hi)})"


def load(pattern):
    out = []
    for f in sorted(glob.glob(pattern)):
        try:
            out.append(json.load(open(f)))
        except (OSError, ValueError):
            pass
    return out


def spread(values, nd=1):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.{nd}f} [{min(values):.{nd}f}, {max(values):.{nd}f}]" if len(values) > 1 else f"{med:.{nd}f}"


def section(d, how):
    graph = how == "graph"
    nt = nccl_tests(os.path.join(d, "nccl-tests-graph.txt" if graph else "nccl-tests.txt"))
    minis = load(os.path.join(d, f"minimal-{how}-*.json"))
    runs = [
        {(r["size_bytes"], r["path"], r["mode"]): r for r in doc["records"] if "time_us" in r}
        for doc in load(os.path.join(d, f"suite-{how}-[0-9].json"))
    ]
    print(
        f"\n### {'CUDA graph replay' if graph else 'Eager'}: {len(runs)} suite runs, {len(minis)} minimal-loop runs; "
        f"nccl-tests {'`-n 20 -G 100`' if graph else '`-n 100` (host-timed)'}\n"
    )
    print(
        "| size | mode | nccl-tests in-place | minimal loop | suite c10d | suite / minimal (medians) | "
        "c10d over nccl-tests | raw (CuPy NCCL, current stream) | tax over in-place | latency (1 op) | wrong |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def col(size, path, mode, key):
        return [run[(size, path, mode)][key] for run in runs if (size, path, mode) in run]

    for size in SIZES:
        ref, ref_text = nccl_in_place(nt, size)
        for mode in MODES:
            times = col(size, "c10d", mode, "time_us")
            if not times:
                continue
            med = statistics.median(times)
            mini = [r["time_us"] for rows in minis for r in rows if (r["size_bytes"], r["mode"]) == (size, mode)]
            ratio = f"{med / statistics.median(mini):.3f}" if mini else "-"
            gap = f"{med / ref:.2f}x (+{med - ref:.1f})" if ref else "-"
            wrong = sum(w or 0 for path in ("c10d", "raw") for w in col(size, path, mode, "wrong"))
            tax = "0" if mode == "in-place" else spread(col(size, "c10d", mode, "tax_us"))
            raw, lat = spread(col(size, "raw", mode, "time_us")), spread(col(size, "c10d", mode, "latency_us"))
            print(
                f"| {label(size)} | {mode} | {ref_text} | {spread(mini)} | {spread(times)} | {ratio} | {gap} | "
                f"{raw} | {tax} | {lat} | {wrong} |"
            )
    big = 256 << 20
    bus = col(big, "c10d", "in-place", "busbw_gbps")
    if big in nt and bus:
        print(
            f"\nbusbw at 256 MiB, in-place: suite c10d {spread(bus)} GB/s, raw "
            f"{spread(col(big, 'raw', 'in-place', 'busbw_gbps'))} GB/s; nccl-tests {nt[big][3]:.1f} GB/s in-place "
            f"({nt[big][1]:.1f} out-of-place): suite / nccl-tests = {statistics.median(bus) / nt[big][3]:.3f}"
        )


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    print("All times in us per allreduce, fp16, 2 ranks; values are median [min, max] over runs.")
    for how in ("eager", "graph"):
        section(d, how)


if __name__ == "__main__":
    main()
