#!/usr/bin/env bash
# The moe-down tables of docs/moe-down.md on one CUDA GPU: every variant's time per call for TP1 and TP4 x tokens
# 1, 4, 16, 64, 512, eager and graph-replayed, after a tiling sweep (graph replay, TP1/TP4 x tokens 1/4/16) whose
# winners triton-htile then takes.
#   bash scripts/device/moe_down.sh [all|table|tune|par]
# all: the sweep, then both tables. table: the tables only (with the sweep's winners if OUT/tune.json exists).
# tune: the sweep only. par: the same on two GPUs at once: sweep TP1 on GPU 0 and TP4 on GPU 1, then the graph
# table on GPU 0 and the eager table on GPU 1 (each table, with its copy anchor, from one GPU).
# TILINGS="LABEL ...": the sweep tries only these tilings (b70bench moe-down --tilings). NO_TUNED=1: the
# tables use each variant's own tiling policy, not the sweep's winners. TUNE_SECONDS: the sweep's budget (150).
# Logs, JSON and env.txt go to OUT (default results/moe-down in this repository); a summary is printed at the end.
# PYTHON: the interpreter with b70bench, CUDA torch and Triton (python3).
set -u -o pipefail
# NVLink SHARP and multicast off, as for the other device scripts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/results/moe-down}
MODE=${1:-all}
TUNE_SECONDS=${TUNE_SECONDS:-150}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
[[ ${PYTHON:-} == */* ]] && PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")  # before the cd
cd "$ROOT" || exit 1
# BACKEND/MOE_ARGS/GRAPH= : a dry run of this script on the CPU (TRITON_INTERPRET=1, small --hidden/--intermediate).
# shellcheck disable=SC2086
bench() { local limit=$1; shift; PYTHONPATH=. timeout "$limit" "${PYTHON:-python3}" -m b70bench moe-down \
  --backend "${BACKEND:-cuda}" ${MOE_ARGS:-} "$@"; }

{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv; "${PYTHON:-python3}" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} > "$OUT/env.txt" 2>&1

if [[ $MODE == par ]]; then
  CUDA_VISIBLE_DEVICES=0 bench $((TUNE_SECONDS + 60)) --tune ${GRAPH---graph} --tp 1 --tokens 1 4 16 --repeat 10 \
    --tune-seconds "$TUNE_SECONDS" ${TILINGS:+--tilings $TILINGS} --json "$OUT/tune-tp1.json" > "$OUT/tune-tp1.log" 2>&1 &
  t1=$!
  CUDA_VISIBLE_DEVICES=1 bench $((TUNE_SECONDS + 60)) --tune ${GRAPH---graph} --tp 4 --tokens 1 4 16 --repeat 10 \
    --tune-seconds "$TUNE_SECONDS" ${TILINGS:+--tilings $TILINGS} --json "$OUT/tune-tp4.json" > "$OUT/tune-tp4.log" 2>&1 &
  t4=$!
  wait $t1; echo "tune tp1 rc=$?"; wait $t4; echo "tune tp4 rc=$?"
  OUT="$OUT" "${PYTHON:-python3}" - <<'PY'
import json, os
out = os.environ["OUT"]
recs, meta = [], {}
for name in ("tune-tp1.json", "tune-tp4.json"):
    try:
        doc = json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        continue
    recs += doc["records"]
    meta = {k: v for k, v in doc.items() if k != "records"}
json.dump({**meta, "records": recs}, open(os.path.join(out, "tune.json"), "w"))
print("merged", len(recs), "tuning rows")
PY
  TUNED=(); [[ -s $OUT/tune.json && -z ${NO_TUNED:-} ]] && TUNED=(--tuned "$OUT/tune.json")
  CUDA_VISIBLE_DEVICES=0 bench "${TABLE_SECONDS:-110}" "${TUNED[@]}" ${GRAPH---graph} --json "$OUT/graph.json" > "$OUT/graph.log" 2>&1 &
  g=$!
  CUDA_VISIBLE_DEVICES=1 bench "${TABLE_SECONDS:-110}" "${TUNED[@]}" --json "$OUT/eager.json" > "$OUT/eager.log" 2>&1 &
  e=$!
  wait $g; echo "graph rc=$?"; wait $e; echo "eager rc=$?"
fi
if [[ $MODE == all || $MODE == tune ]]; then
  bench $((TUNE_SECONDS + 120)) --tune --graph --tp 1 4 --tokens 1 4 16 --repeat 10 --tune-seconds "$TUNE_SECONDS" \
    --json "$OUT/tune.json" > "$OUT/tune.log" 2>&1; echo "tune rc=$?"
fi
if [[ $MODE == all || $MODE == table ]]; then
  TUNED=(); [[ -s $OUT/tune.json && -z ${NO_TUNED:-} ]] && TUNED=(--tuned "$OUT/tune.json")
  bench 240 "${TUNED[@]}" --json "$OUT/eager.json" > "$OUT/eager.log" 2>&1; echo "eager rc=$?"
  bench 240 "${TUNED[@]}" ${GRAPH---graph} --json "$OUT/graph.json" > "$OUT/graph.log" 2>&1; echo "graph rc=$?"
fi

cat "$OUT/env.txt"
tail -n 3 "$OUT"/*.log
OUT="$OUT" "${PYTHON:-python3}" - <<'PY'
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
