"""The baseline the allreduce suite must match: a hand-written torch.distributed loop, nothing else.

    torchrun --standalone --nproc-per-node 2 scripts/device/minimal_allreduce.py [--graph]
Prints one JSON line (rank 0): per size and mode, the median over 20 samples of 100 back-to-back
fp16 allreduces (host clock after synchronize), maximum over ranks. allreduce_abab.py times the
same minimal() against the suite's row in one process.
"""

import json
import os
import statistics
import sys
import time

ITERS, REPEAT, SIZES, MODES = 100, 20, (8, 6144, 1 << 20, 256 << 20), ("in-place", "clone", "empty-copy")


def minimal(size: int, mode: str, graph: bool, iters: int, repeat: int, device) -> float:
    """The loop for one (size, mode): per-rank median seconds per op, max over ranks (also
    allreduce_abab.py's A side)."""
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    x = torch.ones(size // 2, dtype=torch.float16, device=device)
    out = torch.empty_like(x)
    op = {
        "in-place": lambda: dist.all_reduce(x),
        "clone": lambda: dist.all_reduce(x.clone()),
        "empty-copy": lambda: dist.all_reduce(out.copy_(x)),
    }[mode]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (on a side stream, as graph capture requires)
            for _ in range(5):
                op()
        torch.cuda.current_stream().wait_stream(side)
    else:
        for _ in range(5):
            op()
    g = torch.cuda.CUDAGraph() if graph else None
    try:
        if graph:
            with torch.cuda.graph(g):
                for _ in range(iters):
                    op()
        samples = []
        for _ in range(repeat):
            sync()
            t0 = time.perf_counter()
            if graph:
                g.replay()
            else:
                for _ in range(iters):
                    op()
            sync()
            samples.append((time.perf_counter() - t0) / iters)
    finally:
        if g is not None:
            sync()
            g.reset()  # before the group goes away: destroy_process_group hung with live graphs
    worst = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


def main() -> int:
    import torch
    import torch.distributed as dist

    graph = "--graph" in sys.argv
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rows = [
        {
            "size_bytes": size,
            "mode": mode,
            "graph": graph,
            "time_us": minimal(size, mode, graph, ITERS, REPEAT, torch.device("cuda", local)) * 1e6,
        }
        for size in SIZES
        for mode in MODES
    ]
    torch.cuda.synchronize()
    dist.barrier(device_ids=[local])
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
