"""The baseline the allreduce suite must match: a hand-written torch.distributed loop, nothing else.

    torchrun --standalone --nproc-per-node 2 scripts/device/minimal_allreduce.py [--graph]
Prints one JSON line (rank 0): per size and mode, the median over 20 samples of 100 back-to-back
fp16 allreduces (host clock after synchronize), maximum over ranks.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

ITERS, REPEAT, GRAPH = 100, 20, "--graph" in sys.argv
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rows = []
for size in (8, 6144, 1 << 20, 256 << 20):
    x = torch.ones(size // 2, dtype=torch.float16, device="cuda")
    out = torch.empty_like(x)
    modes = {"in-place": lambda x=x: dist.all_reduce(x), "clone": lambda x=x: dist.all_reduce(x.clone()),
             "empty-copy": lambda x=x, out=out: dist.all_reduce(out.copy_(x))}
    for mode, op in modes.items():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (on a side stream, as graph capture requires)
            for _ in range(5):
                op()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph() if GRAPH else None
        if GRAPH:
            with torch.cuda.graph(graph):
                for _ in range(ITERS):
                    op()
        samples = []
        for _ in range(REPEAT):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if GRAPH:
                graph.replay()
            else:
                for _ in range(ITERS):
                    op()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) / ITERS)
        worst = torch.tensor([statistics.median(samples)], dtype=torch.float64, device="cuda")
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        rows.append({"size_bytes": size, "mode": mode, "graph": GRAPH, "time_us": worst.item() * 1e6})
        if GRAPH:
            graph.reset()  # before the group goes away: destroy_process_group hung with live graphs
torch.cuda.synchronize()
dist.barrier(device_ids=[local])
dist.destroy_process_group()
if int(os.environ["RANK"]) == 0:
    print(json.dumps(rows))
