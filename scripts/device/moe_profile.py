"""One moe-down Triton tiling on one shape, called a few times: the program ncu profiles (moe_dram.sh, moe_probe.sh).

    PYTHONPATH=. ncu --clock-control none -k regex:_moe_down --launch-skip 5 --launch-count 1 \
        python3 scripts/device/moe_profile.py --tp 1 --tokens 1 --config m1n64k256s1w8st1fused-packed

From the repository root (or with b70bench installed). ncu replays the profiled launch with its caches flushed,
so the weights come from HBM as in the suite. `--device cpu` with TRITON_INTERPRET=1: a dry run without a GPU.
"""

import argparse

import torch

from b70bench.moe import configs, shapes, variants

ap = argparse.ArgumentParser()
ap.add_argument("--tp", type=int, default=1)
ap.add_argument("--tokens", type=int, default=1)
ap.add_argument("--config", required=True, help="a tiling label, as the sweep prints it")
ap.add_argument("--calls", type=int, default=8)
ap.add_argument("--device", default="cuda", help="cpu: a dry run under TRITON_INTERPRET=1")
args = ap.parse_args()

shape = shapes.MoeShape()
k = shape.k(args.tp)
dev = torch.device(args.device)
w = shapes.random_weights(shape, k, torch.bfloat16, dev, 1)
batch = shapes.random_batch(shape, k, args.tokens, torch.bfloat16, dev, 2)
out = torch.empty((args.tokens, shape.hidden), dtype=torch.bfloat16, device=dev)
run = variants.TritonVariant("profile", config=configs.parse_label(args.config)).prepare(w, batch, out)
for _ in range(args.calls):
    run()
if dev.type == "cuda":
    torch.cuda.synchronize()
# ncu's dram__bytes_read next to this: bytes read beyond the roofline's are weights read twice.
print(
    "ok",
    args.config,
    float(out.float().abs().mean()),
    "roofline_bytes",
    shapes.roofline_bytes(shape, k, batch, torch.bfloat16),
    "experts_hit",
    batch.experts_hit,
)
