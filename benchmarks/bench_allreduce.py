"""Allreduce per path, mode and size: pipelined time, latency and busbw (asv adapter).

Paths: c10d (torch.distributed), raw (NCCL through CuPy, CUDA only) and vllm (vLLM's own
tensor-parallel all_reduce, the one a patch to vLLM's communicators moves). A path that cannot
run here is a skipped row with its reason.
"""

from b70bench.comm.params import MIB, MODES, PATHS, Params

from .common import select_device, skip_if

SIZES = [8, 6144, MIB, 256 * MIB]
# gloo on a small CI machine takes about a second per 256 MiB op; asv keeps the CPU run short.
CPU_SIZES = [s for s in SIZES if s <= MIB]


class Allreduce:
    """All (mode, size) rows come from one launch of the ranks in setup_cache; track_* only read it."""

    param_names = ["path", "mode", "size"]
    params = [list(PATHS), list(MODES), SIZES]
    timeout = 900
    version = 2  # 2: the path parameter

    def setup_cache(self):
        # Imported here, not at the top: asv runs every (path, mode, size) of every track_ figure in a process of
        # its own, and those only read this cache; importing torch in each cost ~1 s, 144 times on the CPU.
        from b70bench import allreduce

        dev = select_device()
        skip_if(allreduce.unavailable_reason(dev))
        cpu = dev.backend == "cpu"
        rows = allreduce.measure(
            Params(
                sizes=CPU_SIZES if cpu else SIZES, paths=list(PATHS), budget_s=0.5 if cpu else None, backend=dev.backend
            )
        )
        return {(r["path"], r["mode"], r["size_bytes"]): r for r in rows}

    def setup(self, cache, path, mode, size):
        row = cache.get((path, mode, size))
        if row is None:
            skip_if(f"{size} B is not measured on this backend in asv runs (gloo on the CPU stops at 1 MiB)")
        skip_if(row.get("skipped"))

    def track_time(self, cache, path, mode, size):
        return {"samples": cache[(path, mode, size)]["samples_s"], "number": 1}

    track_time.unit = "seconds"

    def track_latency(self, cache, path, mode, size):
        return cache[(path, mode, size)]["latency_us"] * 1e-6

    track_latency.unit = "seconds"

    def track_busbw(self, cache, path, mode, size):
        return cache[(path, mode, size)]["busbw_gbps"]

    track_busbw.unit = "GB/s"
