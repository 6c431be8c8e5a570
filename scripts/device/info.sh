#!/usr/bin/env bash
# The copy-bandwidth anchor on a CUDA machine (docs/timing.md, "bash scripts/device/info.sh"): the fingerprint,
# which suites run here (`b70bench info --measure`), device-to-device copy at 256 MiB / 1 GiB / 4 GiB on GPU 0
# and 1 GiB on GPU 1 (if there is one), and a 4 MiB copy timed eager and graph-replayed. Then the one-line
# errors for a device index and backends that are not there (their exit codes printed).
#   bash scripts/device/info.sh
# Writes info.log, info-cuda0.json and copy-cuda0.json to OUT (default results/info in this repository).
# PYTHON: the interpreter with b70bench and CUDA torch (python3).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/results/info}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
[[ ${PYTHON:-} == */* ]] && PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")  # before the cd
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
B="timeout 300 ${PYTHON:-python3} -m b70bench"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $B info --measure --json "$OUT/info-cuda0.json"
  $B info --measure
  $B copy --mib 256 1024 4096 --json "$OUT/copy-cuda0.json"
  if [[ $(nvidia-smi -L | wc -l) -gt 1 ]]; then $B copy --device-index 1 --mib 1024; fi
  timeout 120 "${PYTHON:-python3}" - <<'PY'
import torch
from b70bench import device, timing
dev = device.select()
x = torch.randn(1 << 20, device=dev.torch_device)
y = torch.empty_like(x)
eager = timing.measure(dev, lambda: y.copy_(x), repeat=50, number=10)
graph = timing.measure(dev, lambda: y.copy_(x), repeat=50, number=10, graph=True)
print(f"4 MiB copy: eager {eager.median*1e6:.2f} us/op, graph replay {graph.median*1e6:.2f} us/op, memory_in_use {dev.memory_in_use()} B")
PY
  $B info --device-index 7; echo "rc=$?"
  $B info --backend xpu; echo "rc=$?"
  $B info --backend tpu; echo "rc=$?"
} 2>&1 | tee "$OUT/info.log"
