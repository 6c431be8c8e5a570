"""Allreduce: in-place / clone / empty-copy / functional per size, pipelined time and busbw (asv adapter)."""

from b70bench import allreduce
from b70bench.comm.params import MIB, MODES, Params

from .common import select_device, skip_if

SIZES = [8, 6144, MIB, 256 * MIB]
# gloo on a small CI machine takes about a second per 256 MiB op; asv keeps the CPU run short.
CPU_SIZES = [s for s in SIZES if s <= MIB]


class Allreduce:
    """All (mode, size) rows come from one launch of the ranks in setup_cache; track_* only read it."""

    param_names = ["mode", "size"]
    params = [list(MODES), SIZES]
    timeout = 900
    version = 1

    def setup_cache(self):
        dev = select_device()
        skip_if(allreduce.unavailable_reason(dev))
        cpu = dev.backend == "cpu"
        rows = allreduce.measure(Params(sizes=CPU_SIZES if cpu else SIZES, paths=["c10d"],
                                        budget_s=0.5 if cpu else None, backend=dev.backend))
        return {(r["mode"], r["size_bytes"]): r for r in rows}

    def setup(self, cache, mode, size):
        row = cache.get((mode, size))
        if row is None:
            skip_if(f"{size} B is not measured on this backend in asv runs (gloo on the CPU stops at 1 MiB)")
        skip_if(row.get("skipped"))

    def track_time(self, cache, mode, size):
        return {"samples": cache[(mode, size)]["samples_s"], "number": 1}

    track_time.unit = "seconds"

    def track_latency(self, cache, mode, size):
        return cache[(mode, size)]["latency_us"] * 1e-6

    track_latency.unit = "seconds"

    def track_busbw(self, cache, mode, size):
        return cache[(mode, size)]["busbw_gbps"]

    track_busbw.unit = "GB/s"
