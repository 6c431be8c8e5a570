"""The `raw` path: NCCL called directly through CuPy's binding, on torch's current stream.

Beside c10d it shows how much of a small allreduce is the collective and how much is the
framework (Python dispatch, the work object, the fences between torch's stream and
ProcessGroupNCCL's own stream): raw enqueues ncclAllReduce on the caller's stream and nothing else.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def unavailable_reason(backend: str) -> str | None:
    if backend != "cuda":
        return "raw path calls NCCL through CuPy and needs a CUDA device"
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception as err:  # ImportError, or a CuPy without its NCCL library
        return f"CuPy's NCCL binding is not importable ({type(err).__name__}: {err}); install cupy-cuda12x/13x"
    return None


class RawNccl:
    """One NCCL communicator over the same ranks as the torch process group."""

    def __init__(self, rank: int, world: int, device_index: int):
        import cupy
        from cupy.cuda import nccl

        self._nccl = nccl
        # The unique id travels over the already-initialised torch group; no second rendezvous.
        uid = [nccl.get_unique_id() if rank == 0 else None]
        dist.broadcast_object_list(uid, src=0)
        with cupy.cuda.Device(device_index):
            self.comm = nccl.NcclCommunicator(world, uid[0], rank)
        self._types = {
            torch.float16: nccl.NCCL_FLOAT16,
            torch.float32: nccl.NCCL_FLOAT32,
            # ncclBfloat16 is 9 in nccl.h (NCCL >= 2.10); older CuPy lacks the name.
            torch.bfloat16: getattr(nccl, "NCCL_BFLOAT16", 9),
        }
        self.version = nccl.get_version()

    def all_reduce_(self, t: torch.Tensor) -> None:
        """Sum t across ranks in place, enqueued on torch's current stream (graph-capturable)."""
        self.comm.allReduce(
            t.data_ptr(),
            t.data_ptr(),
            t.numel(),
            self._types[t.dtype],
            self._nccl.NCCL_SUM,
            torch.cuda.current_stream().cuda_stream,
        )

    def close(self) -> None:
        self.comm.destroy()
