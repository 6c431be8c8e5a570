"""The bandwidth anchor: device-to-device copy, counting bytes read plus bytes written.

Every other suite states its bandwidth as a fraction of this figure, measured in the same
run on the same device, because datasheet numbers are never what the memory system gives.
"""

from __future__ import annotations

import functools

import torch

from b70bench import device as devmod
from b70bench import options, records, timing
from b70bench.fingerprint import fingerprint

GIB = 1 << 30
MIB = 1 << 20


def default_bytes(dev: devmod.Device) -> int:
    # 1 GiB is many times any GPU's L2; the CPU gets a smaller buffer to keep CI quick
    # (still far beyond its last-level cache).
    return 256 * MIB if dev.backend == "cpu" else GIB


def unavailable_reason(dev: devmod.Device) -> str | None:
    return None


def measure(dev: devmod.Device, nbytes: int | None = None, *, repeat: int = 30, warmup: int = 5) -> dict:
    """One record: median copy time and bandwidth = 2 * bytes / time (read + written)."""
    nbytes = nbytes or default_bytes(dev)
    if nbytes <= 0 or nbytes % 4:
        raise ValueError(f"copy size must be a positive multiple of 4 bytes, got {nbytes}")
    gen = torch.Generator(device="cpu").manual_seed(0)
    src = torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), dtype=torch.int32, generator=gen).to(dev.torch_device)
    dst = torch.full_like(src, -1)  # poisoned, so an unwritten element shows up as wrong
    t = timing.measure(dev, lambda: dst.copy_(src), warmup=warmup, repeat=repeat)
    wrong = int((dst != src).sum())
    return records.record(
        "copy",
        bytes=nbytes,
        **t.summary(),
        samples_s=t.samples,
        bandwidth_gbps=2 * nbytes / t.median / 1e9,
        bandwidth_gbps_max=2 * nbytes / t.min / 1e9,
        wrong=wrong,
    )


@functools.cache
def anchor_gbps(dev: devmod.Device) -> float:
    """Copy bandwidth of dev in GB/s, measured once per process for suites to compare against."""
    return measure(dev)["bandwidth_gbps"]


COLUMNS = ["suite", "bytes", "time_us", "time_us_iqr", "bandwidth_gbps", "wrong"]


def run(args) -> int:
    dev = devmod.select(args.backend, args.device_index)
    sizes = [int(s * MIB) for s in args.mib] if args.mib else [default_bytes(dev)]
    rows = [measure(dev, n, repeat=args.repeat) for n in sizes]
    print(records.format_table(rows, COLUMNS))
    if args.json:
        records.write_json(args.json, rows, fingerprint=fingerprint(dev))
    return 1 if any(r["wrong"] for r in rows) else 0


def register(sub) -> None:
    p = sub.add_parser(
        "copy",
        help="device-to-device copy bandwidth (the anchor)",
        description="Device-to-device copy bandwidth, bytes read + written per second.",
    )
    options.add_device_args(p)
    p.add_argument("--mib", type=float, nargs="+", help="buffer sizes in MiB (default 1024 on GPUs, 256 on the CPU)")
    p.add_argument("--repeat", type=int, default=30, help="timed samples per size (median reported)")
    options.add_json_arg(p)
    p.set_defaults(func=run)
