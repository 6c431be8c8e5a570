"""The one place that knows about accelerators: backend choice, sync, events, graphs, memory.

Every suite asks `select()` for a Device and times through it, so XPU, CUDA and the CPU
are handled once. Order of preference: xpu, then cuda, then cpu; `--backend` or the
environment variable B70BENCH_BACKEND overrides it, `--device-index` or
B70BENCH_DEVICE_INDEX picks the card.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from b70bench.errors import UsageError

if TYPE_CHECKING:
    import torch

# torch is imported where a function needs it, not at import: asv imports the suites that import this module once
# per figure, and on the CPU (B70BENCH_BACKEND=cpu) choosing the device needs no torch (~1.7 s a process).

BACKENDS = ("xpu", "cuda", "cpu")
ENV_BACKEND = "B70BENCH_BACKEND"
ENV_INDEX = "B70BENCH_DEVICE_INDEX"

# The collective library each backend's devices talk through in torch.distributed.
COLLECTIVE_BACKEND = {"xpu": "xccl", "cuda": "nccl", "cpu": "gloo"}


def _module(backend: str):
    """torch.cuda / torch.xpu, or None for the CPU."""
    if backend == "cpu":
        return None
    import torch

    return getattr(torch, backend, None)


def available(backend: str) -> bool:
    mod = _module(backend)
    if backend == "cpu":
        return True
    return mod is not None and mod.is_available()


def _missing_reason(backend: str) -> str:
    import torch

    build = torch.__version__
    if backend == "cuda":
        if torch.version.cuda is None:
            return (
                f"torch {build} is built without CUDA: install a CUDA build of torch "
                f"(pip install '.[cuda]') or pass --backend cpu"
            )
        return (
            "torch sees no CUDA device (driver missing or CUDA_VISIBLE_DEVICES empty): "
            "fix the driver or pass --backend cpu"
        )
    if backend == "xpu":
        if not hasattr(torch, "xpu"):
            return (
                f"torch {build} has no torch.xpu: install an XPU build of torch "
                f"(pip install '.[xpu]') or pass --backend cpu"
            )
        return (
            f"torch {build} sees no XPU device (no XPU build, or no Level Zero driver): "
            f"install torch from PyTorch's xpu index and Intel's GPU driver, or pass --backend cpu"
        )
    return ""


def choose_backend(requested: str | None = None) -> str:
    """The backend to use: the one asked for (flag, then env var), else the best present."""
    requested = requested or os.environ.get(ENV_BACKEND) or None
    if requested is not None:
        requested = requested.strip().lower()
        if requested not in BACKENDS:
            raise UsageError(
                f"unknown backend {requested!r}: use one of {', '.join(BACKENDS)} (--backend or {ENV_BACKEND})"
            )
        if not available(requested):
            raise UsageError(f"backend {requested!r} is not usable here: {_missing_reason(requested)}")
        return requested
    for backend in BACKENDS:
        if available(backend):
            return backend
    return "cpu"


def device_count(backend: str) -> int:
    mod = _module(backend)
    return 1 if mod is None else mod.device_count()


@dataclass(frozen=True)
class Device:
    backend: str
    index: int = 0

    @property
    def torch_device(self) -> torch.device:
        import torch

        if self.backend == "cpu":
            return torch.device("cpu")
        return torch.device(self.backend, self.index)

    @property
    def module(self):
        return _module(self.backend)

    @property
    def name(self) -> str:
        if self.backend == "cpu":
            return _cpu_name()
        return self.module.get_device_name(self.index)

    @property
    def count(self) -> int:
        return device_count(self.backend)

    @property
    def collective_backend(self) -> str:
        return COLLECTIVE_BACKEND[self.backend]

    def synchronize(self) -> None:
        if self.module is not None:
            self.module.synchronize(self.index)

    @property
    def has_events(self) -> bool:
        return self.module is not None and hasattr(self.module, "Event")

    @property
    def has_graphs(self) -> bool:
        if self.backend == "cuda":
            return True
        # XPU graphs arrived in recent torch releases; use them only where torch has them.
        return self.backend == "xpu" and hasattr(self.module, "XPUGraph")

    def elapsed(self, fn, number: int = 1) -> float:
        """Seconds for `number` back-to-back calls of fn, on device events where there are any."""
        if self.has_events:
            start = self.module.Event(enable_timing=True)
            end = self.module.Event(enable_timing=True)
            start.record()
            for _ in range(number):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        self.synchronize()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        self.synchronize()
        return time.perf_counter() - t0

    def capture(self, fn, number: int = 1, warmup: int = 3):
        """A callable that replays `number` calls of fn from a device graph.

        fn is run `warmup` times on a side stream first, as torch requires before capture,
        so lazy allocations and handle creation happen outside the graph.
        """
        if not self.has_graphs:
            raise UsageError(f"backend {self.backend!r} cannot capture graphs: drop --graph")
        mod = self.module
        stream = mod.Stream(self.index)
        stream.wait_stream(mod.current_stream(self.index))
        with mod.stream(stream):
            for _ in range(warmup):
                fn()
        mod.current_stream(self.index).wait_stream(stream)
        self.synchronize()
        graph = mod.CUDAGraph() if self.backend == "cuda" else mod.XPUGraph()
        with mod.graph(graph):
            for _ in range(number):
                fn()
        self.synchronize()
        return graph

    def memory_in_use(self) -> int:
        """Bytes the framework holds on the device; the process's resident set on the CPU."""
        if self.module is not None:
            return int(self.module.memory_allocated(self.index))
        return _rss_bytes()

    def empty_cache(self) -> None:
        if self.module is not None:
            self.module.empty_cache()


def select(backend: str | None = None, index: int | None = None) -> Device:
    """The Device for this run; bad input raises UsageError naming the fix."""
    backend = choose_backend(backend)
    if index is None:
        raw = os.environ.get(ENV_INDEX)
        if raw is not None:
            try:
                index = int(raw)
            except ValueError:
                raise UsageError(f"{ENV_INDEX}={raw!r} is not an integer: set it to a device index such as 0") from None
    index = 0 if index is None else index
    count = device_count(backend)
    if not 0 <= index < count:
        raise UsageError(
            f"device index {index} is out of range: this machine has {count} {backend} "
            f"device(s), use --device-index 0..{count - 1}"
        )
    if backend != "cpu":
        # Events and streams are recorded on the current device: make it the one we time.
        _module(backend).set_device(index)
    return Device(backend, index)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
