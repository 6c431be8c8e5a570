"""What reading N bytes once costs on this GPU at the moe-down row sizes: the floor under a row's time.

    python3 scripts/device/read_floor.py [MB ...]      (default: 4.9 and 19.5 MB, TP4 and TP1 tokens 1)

For each size: torch's copy (reads and writes N), torch's sum (reads N, writes one value) and a
Triton kernel that only streams N in (one program per 16 KiB, 16-byte loads, one value out per program)
of a bf16 buffer, graph-replayed 16 calls at a time over enough rotated buffers (>= 8x the L2) that
every read comes from HBM, timed on device events, median of 30 replays. One JSON line per (op, size). `launch`: the
Triton kernel with nothing to read (132 programs), i.e. a graph-replayed launch alone.
"""

import json
import statistics
import sys

import torch
import triton
import triton.language as tl

CALLS = 16


@triton.jit
def _read(src, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + offs, mask=offs < n, other=0, eviction_policy="evict_first")
    tl.store(out + tl.program_id(0), tl.sum(v, axis=0))


L2 = torch.cuda.get_device_properties(0).L2_cache_size


def floor(op: str, nbytes: int) -> dict:
    n = nbytes // 2
    nbuf = max(CALLS, -(-8 * L2 // nbytes))
    src = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(nbuf)]
    words = [s.view(torch.int32) for s in src]
    block = 4096
    grid = (triton.cdiv(words[0].numel(), block),)
    dst = (
        [torch.empty_like(s) for s in src]
        if op == "copy"
        else [torch.empty(grid[0], device="cuda", dtype=torch.int32) for _ in src]
    )
    state = {"i": 0}

    def call():
        i = state["i"] % nbuf
        state["i"] += 1
        if op == "copy":
            dst[i].copy_(src[i])
        elif op == "sum":
            torch.sum(src[i], dtype=torch.float32)
        elif op == "launch":  # the same kernel reading nothing: what a graph-replayed launch costs by itself
            _read[(132,)](words[i], dst[i], 0, BLOCK=block, num_warps=8)
        else:
            _read[grid](words[i], dst[i], words[i].numel(), BLOCK=block, num_warps=8)

    graphs = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(-(-nbuf // CALLS)):  # one graph per slice of the rotation, replayed in turn
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(CALLS):
                call()
        graphs.append(g)
    for g in graphs:
        g.replay()
    samples = []
    for r in range(30):
        g = graphs[r % len(graphs)]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / CALLS)
    us = statistics.median(samples)
    moved = {"copy": 2 * nbytes, "launch": 0}.get(op, nbytes)
    for g in graphs:
        g.reset()
    return {"op": op, "mb": nbytes / 1e6, "buffers": nbuf, "time_us": us, "gbps": moved / us / 1e3}


if __name__ == "__main__":
    sizes = [float(a) for a in sys.argv[1:]] or [4.9, 19.5]
    for mb in sizes:
        for op in ("launch", "read", "sum", "copy"):
            print(json.dumps(floor(op, int(mb * 1e6) // 64 * 64)), flush=True)
