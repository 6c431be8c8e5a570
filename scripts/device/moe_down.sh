#!/usr/bin/env bash
# The moe-down measurements on one GPU of the device machine, in one call:
#   bash scripts/device/moe_down.sh [all|table|tune]
# all: the tiling sweep (graph replay, TP1/TP4 x tokens 1/4/16; triton-htile then takes its winners), then every variant's table for
# TP1 and TP4 x tokens 1,4,16,64,512, eager and graph-replayed. Logs and JSON go to $OUT.
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
OUT=${OUT:-/tmp/moe-down-out}
MODE=${1:-all}
TUNE_SECONDS=${TUNE_SECONDS:-150}
mkdir -p "$OUT"
bench() { local limit=$1; shift; PYTHONPATH=. timeout "$limit" python3 -m b70bench moe-down --backend cuda "$@"; }

{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} > "$OUT/env.txt" 2>&1

if [[ $MODE == all || $MODE == tune ]]; then
  bench $((TUNE_SECONDS + 120)) --tune --graph --tp 1 4 --tokens 1 4 16 --repeat 10 --tune-seconds "$TUNE_SECONDS" \
    --json "$OUT/tune.json" > "$OUT/tune.log" 2>&1; echo "tune rc=$?"
fi
if [[ $MODE == all || $MODE == table ]]; then
  TUNED=(); [[ -s $OUT/tune.json ]] && TUNED=(--tuned "$OUT/tune.json")
  bench 240 "${TUNED[@]}" --json "$OUT/eager.json" > "$OUT/eager.log" 2>&1; echo "eager rc=$?"
  bench 240 "${TUNED[@]}" --graph --json "$OUT/graph.json" > "$OUT/graph.log" 2>&1; echo "graph rc=$?"
fi

cat "$OUT/env.txt"
tail -n 3 "$OUT"/*.log
OUT="$OUT" python3 - <<'PY'
import json, os, collections
out = os.environ["OUT"]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))["records"]
    except (OSError, ValueError, KeyError):
        return []
tune = load("tune.json")
best = collections.defaultdict(list)
for r in tune:
    best[(r["tp"], r["tokens"])].append(r)
for key, rows in sorted(best.items()):
    print("tune tp%d t%d" % key)
    for r in rows[:4] + rows[-1:]:
        print("  %-28s %5d prog %8.2f us %6.3f copy rel %.1e %s" % (r["config"], r["programs"], r["time_us"],
              r["frac_copy"], r["rel_err"], r["ok"]))
for name in ("eager.json", "graph.json"):
    rows = load(name)
    if rows:
        print(name, "copy %.0f GB/s" % rows[0]["copy_gbps"])
    for r in rows:
        if r.get("skipped"):
            print("  %-13s tp%d t%-4d skipped: %s" % (r["variant"], r["tp"], r["tokens"], r["skipped"][:70]))
        else:
            print("  %-13s tp%d t%-4d %9.2f us %7.0f GB/s %6.3f copy max %.1e ref %.1e %s %s" % (
                r["variant"], r["tp"], r["tokens"], r["time_us"], r["gbps"], r["frac_copy"], r["max_diff"],
                r["max_diff_ref"], r["ok"], r.get("config")))
PY
