"""Markdown table from one allreduce evidence run (scripts/device/allreduce.sh's folder).

    python3 scripts/device/allreduce_report.py /tmp/allreduce-h200x2 > table.md
Standard library only: it runs on the device machine and here.
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


def load(pattern):
    out = []
    for f in sorted(glob.glob(pattern)):
        try:
            out.append(json.load(open(f)))
        except (OSError, ValueError):
            pass
    return out


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def spread(values, nd=1):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.{nd}f} [{min(values):.{nd}f}, {max(values):.{nd}f}]" if len(values) > 1 else f"{med:.{nd}f}"


def section(d, how):
    graph = how == "graph"
    nt = nccl_tests(os.path.join(d, "nccl-tests-graph.txt" if graph else "nccl-tests.txt"))
    mini = {(r["size_bytes"], r["mode"]): r["time_us"] for rs in load(os.path.join(d, f"minimal-{how}.json"))
            for r in rs}
    runs = [{(r["size_bytes"], r["path"], r["mode"]): r for r in doc["records"] if "time_us" in r}
            for doc in load(os.path.join(d, f"suite-{how}-*.json"))]
    print(f"\n### {'CUDA graph' if graph else 'Eager'} ({len(runs)} suite runs; "
          f"nccl-tests {'-G 100' if graph else 'host-timed'}, -n 100)\n")
    print("| size | mode | nccl-tests in-place us | minimal loop us | suite c10d us, median [min, max] | "
          "suite / minimal | suite / nccl-tests | raw (CuPy NCCL) us | tax over in-place us [min, max] | "
          "latency us | wrong |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in SIZES:
        for mode in MODES:
            times = [run[(size, "c10d", mode)]["time_us"] for run in runs if (size, "c10d", mode) in run]
            if not times:
                continue
            med = statistics.median(times)
            taxes = [run[(size, "c10d", mode)].get("tax_us") for run in runs if (size, "c10d", mode) in run]
            lat = [run[(size, "c10d", mode)]["latency_us"] for run in runs if (size, "c10d", mode) in run]
            raw = [run[(size, "raw", mode)]["time_us"] for run in runs if (size, "raw", mode) in run]
            wrong = sum(run[(size, "c10d", mode)]["wrong"] or 0 for run in runs if (size, "c10d", mode) in run)
            wrong += sum(run[(size, "raw", mode)]["wrong"] or 0 for run in runs if (size, "raw", mode) in run)
            ref = nt.get(size, (None, None, None, None))[2]
            m = mini.get((size, mode))
            print(f"| {label(size)} | {mode} | {fmt(ref)} | {fmt(m)} | {spread(times)} | "
                  f"{fmt(med / m, 3) if m else '-'} | {fmt(med / ref, 2) + 'x' if ref else '-'} | {spread(raw)} | "
                  f"{spread(taxes) if mode != 'in-place' else '0'} | {spread(lat)} | {wrong} |")
    big = 256 << 20
    if big in nt:
        bus = [run[(big, "c10d", "in-place")]["busbw_gbps"] for run in runs if (big, "c10d", "in-place") in run]
        rawbus = [run[(big, "raw", "in-place")]["busbw_gbps"] for run in runs if (big, "raw", "in-place") in run]
        if bus:
            b = statistics.median(bus)
            print(f"\nbusbw at 256 MiB, in-place: suite c10d {spread(bus)} GB/s, raw {spread(rawbus)} GB/s; "
                  f"nccl-tests {nt[big][3]:.1f} GB/s in-place, {nt[big][1]:.1f} GB/s out-of-place; "
                  f"suite / nccl-tests in-place = {b / nt[big][3]:.3f}")


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    for how in ("eager", "graph"):
        section(d, how)


if __name__ == "__main__":
    main()
