"""How many programs of each moe-down kernel share an SM, and what the shared-memory carveout does to them.

    CARVEOUT=100 PYTHONPATH=. python3 scripts/device/moe_residency.py moe-down --backend cuda --tune --graph \\
        --tp 1 --tokens 1 --tilings LABEL ...

Runs `b70bench` with the given arguments; for every decode kernel it compiles, prints one `OCC` JSON line: its
registers, static and dynamic shared memory, warps, the -oN pad and the programs per SM the driver allows
(cuOccupancyMaxActiveBlocksPerMultiprocessor). CARVEOUT (0-100, or -1 for the driver's choice) first sets the
kernel's preferred shared-memory carveout (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT), i.e. how much of
the SM's memory is shared memory rather than L1. CUDA only (libcuda through ctypes). Results: docs/moe-down.md.
"""

import ctypes
import json
import os
import runpy
import sys

from b70bench.moe import kernels

CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_NUM_REGS, CU_FUNC_ATTRIBUTE_CARVEOUT = 1, 4, 9
cuda = ctypes.CDLL("libcuda.so.1")
carveout = os.environ.get("CARVEOUT")
seen = set()
launch = kernels._moe_down_vec.run


def attribute(fn, which: int) -> int:
    v = ctypes.c_int()
    cuda.cuFuncGetAttribute(ctypes.byref(v), which, ctypes.c_void_p(fn))
    return v.value


def run(*args, **kwargs):
    compiled = launch(*args, **kwargs)
    fn = getattr(compiled, "function", None)  # None for a warmup (compile-only) call
    if fn and fn not in seen:
        seen.add(fn)
        if carveout is not None:
            cuda.cuFuncSetAttribute(ctypes.c_void_p(fn), CU_FUNC_ATTRIBUTE_CARVEOUT, ctypes.c_int(int(carveout)))
        blocks = ctypes.c_int()
        cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks),
            ctypes.c_void_p(fn),
            ctypes.c_int(compiled.metadata.num_warps * 32),
            ctypes.c_size_t(compiled.metadata.shared),
        )
        print(
            "OCC",
            json.dumps(
                dict(
                    regs=attribute(fn, CU_FUNC_ATTRIBUTE_NUM_REGS),
                    static_smem=attribute(fn, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                    dyn_smem=compiled.metadata.shared,
                    warps=compiled.metadata.num_warps,
                    pad=kwargs.get("PAD", 0),
                    carveout=attribute(fn, CU_FUNC_ATTRIBUTE_CARVEOUT),
                    programs_per_sm=blocks.value,
                )
            ),
            flush=True,
        )
    return compiled


kernels._moe_down_vec.run = run
sys.argv = ["b70bench"] + sys.argv[1:]
runpy.run_module("b70bench", run_name="__main__")
