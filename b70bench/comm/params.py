"""What an allreduce run measures: sizes, dtypes, modes, paths, and the bandwidth formulas.

Everything here is plain data and parsing, so the launcher can hand it to rank processes as
JSON and tests can check it without starting any.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from b70bench.errors import UsageError

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# The seeds' lab table: a decode-sized message, one hidden row (6 KiB), 1 MiB and 256 MiB.
DEFAULT_SIZES = (8, 6 * KIB, MIB, 256 * MIB)

MODES = ("in-place", "clone", "empty-copy", "functional")
PATHS = ("c10d", "raw", "vllm")
DTYPES = {"fp16": 2, "bf16": 2, "fp32": 4}
DTYPE_ALIASES = {"half": "fp16", "float16": "fp16", "bfloat16": "bf16", "float": "fp32", "float32": "fp32"}

# Device backend or collective library, as a user may name either.
COLLECTIVES = {"nccl": "cuda", "xccl": "xpu", "ccl": "xpu", "gloo": "cpu"}

_SUFFIX = {
    "": 1,
    "B": 1,
    "K": KIB,
    "KB": KIB,
    "KIB": KIB,
    "M": MIB,
    "MB": MIB,
    "MIB": MIB,
    "G": GIB,
    "GB": GIB,
    "GIB": GIB,
}


def parse_size(text: str) -> int:
    """'8', '6K', '6KiB', '1M', '256MiB', '1G' -> bytes (binary multiples, as nccl-tests reads them)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _SUFFIX:
        raise UsageError(f"cannot read size {text!r}: write bytes with an optional K/M/G suffix, e.g. 8, 6K, 1M, 256M")
    value = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if value != int(value) or value <= 0:
        raise UsageError(f"size {text!r} is not a positive whole number of bytes: e.g. 8, 6K, 1M")
    return int(value)


def parse_sizes(items) -> list[int]:
    """A list of sizes; each item may itself be comma-separated."""
    out = []
    for item in items:
        out += [parse_size(part) for part in str(item).split(",") if part.strip()]
    if not out:
        raise UsageError("no sizes given: pass e.g. --sizes 8 6K 1M 256M")
    return out


def parse_sweep(text: str) -> list[int]:
    """'MIN:MAX' -> MIN, 2*MIN, 4*MIN, ... up to MAX (nccl-tests' -b/-e/-f 2)."""
    parts = str(text).split(":")
    if len(parts) != 2:
        raise UsageError(f"cannot read sweep {text!r}: write MIN:MAX, e.g. --sweep 8:256M")
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    if lo > hi:
        raise UsageError(f"sweep {text!r} runs backwards: MIN must not exceed MAX")
    out = []
    while lo <= hi:
        out.append(lo)
        lo *= 2
    return out


def parse_dtype(text: str) -> str:
    name = DTYPE_ALIASES.get(str(text).lower(), str(text).lower())
    if name not in DTYPES:
        raise UsageError(f"unknown dtype {text!r}: use one of {', '.join(DTYPES)}")
    return name


def parse_list(text, allowed: tuple[str, ...], what: str) -> list[str]:
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out = []
    for item in items:
        for name in str(item).split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name == "all":
                out += [a for a in allowed if a not in out]
            elif name not in allowed:
                raise UsageError(f"unknown {what} {name!r}: use one or more of {', '.join(allowed)} (comma-separated)")
            elif name not in out:
                out.append(name)
    if not out:
        raise UsageError(f"no {what} given: use one or more of {', '.join(allowed)}")
    return out


def default_budget_s(device_backend: str) -> float:
    return 1.0 if device_backend == "cpu" else 4.0


def count_for(size_bytes: int, dtype: str) -> int:
    """Elements in a message; a size that is not a whole number of elements is an input error."""
    item = DTYPES[dtype]
    if size_bytes % item:
        raise UsageError(
            f"size {size_bytes} B is not a multiple of {dtype}'s {item} bytes: "
            f"pick a multiple of {item} (or another --dtype)"
        )
    return size_bytes // item


# nccl-tests' definitions (its doc/PERFORMANCE.md), so our figures and theirs compare 1:1:
#   algbw = S / t            S = message bytes, t = time per allreduce
#   busbw = algbw * 2(n-1)/n a ring allreduce moves 2(n-1)/n * S through each rank's slowest
#                            link, so busbw is comparable across world sizes and with link speed.
def algbw_gbps(size_bytes: int, time_s: float) -> float:
    return size_bytes / time_s / 1e9


def busbw_gbps(size_bytes: int, time_s: float, world_size: int) -> float:
    return algbw_gbps(size_bytes, time_s) * 2 * (world_size - 1) / world_size


@dataclass
class Params:
    """One run's settings; travels to the rank processes as JSON."""

    sizes: list[int] = field(default_factory=lambda: list(DEFAULT_SIZES))
    dtype: str = "fp16"
    modes: list[str] = field(default_factory=lambda: list(MODES))
    paths: list[str] | None = None  # None: c10d, plus raw where CuPy's NCCL imports (vllm when named)
    world_size: int | None = None  # None: every local GPU (at least 2 on the CPU)
    backend: str | None = None  # device backend (cuda/xpu/cpu) or collective (nccl/xccl/ccl/gloo)
    graph: bool = False
    iters: int = 100  # back-to-back ops per pipelined sample
    repeat: int = 20  # pipelined samples
    warmup: int = 5
    budget_s: float | None = None  # per row: fewer iterations for sizes that would take longer
    # (None: 4 s on GPUs, 1 s on the CPU, where CI runs it)
    timeout_s: float = 300.0  # whole run: a rank still running after this is killed

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Params:
        return cls(**json.loads(text))

    def validate(self) -> Params:
        self.dtype = parse_dtype(self.dtype)
        self.modes = parse_list(self.modes, MODES, "mode")
        if self.paths is not None:
            self.paths = parse_list(self.paths, PATHS, "path")
        for size in self.sizes:
            if size <= 0:
                raise UsageError(f"size {size} B is not positive: pass sizes like 8, 6K, 1M")
            count_for(size, self.dtype)
        if self.world_size is not None and self.world_size < 1:
            raise UsageError(f"world size {self.world_size} is below 1: pass --world-size 1 or more")
        for name in ("iters", "repeat"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1")
        if self.warmup < 0 or (self.budget_s is not None and self.budget_s <= 0) or self.timeout_s <= 0:
            raise UsageError("--warmup must be >= 0, --budget-s and --timeout > 0")
        return self
