#!/usr/bin/env bash
# Issue 2 evidence on the device tool: fingerprint, suite availability and copy anchor.
# Usage on the device machine (repo root): bash scripts/device/info.sh   (writes under $OUT)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/b70bench-out}; mkdir -p "$OUT"
B="timeout 300 env PYTHONPATH=. python3 -m b70bench"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $B info --measure --json "$OUT/info-cuda0.json"
  $B info --measure
  $B copy --mib 256 1024 4096 --json "$OUT/copy-cuda0.json"
  $B copy --device-index 1 --mib 1024
  $B info --device-index 7; echo "rc=$?"
  $B info --backend xpu; echo "rc=$?"
  $B info --backend tpu; echo "rc=$?"
  timeout 120 python3 - <<'PY'
import torch
from b70bench import device, timing
dev = device.select()
x = torch.randn(1 << 20, device=dev.torch_device)
y = torch.empty_like(x)
eager = timing.measure(dev, lambda: y.copy_(x), repeat=50, number=10)
graph = timing.measure(dev, lambda: y.copy_(x), repeat=50, number=10, graph=True)
print(f"4 MiB copy: eager {eager.median*1e6:.2f} us/op, graph replay {graph.median*1e6:.2f} us/op, memory_in_use {dev.memory_in_use()} B")
PY
} 2>&1 | tee "$OUT/info.log"
