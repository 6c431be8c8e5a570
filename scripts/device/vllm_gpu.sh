#!/usr/bin/env bash
# b70bench's vLLM paths on one NVIDIA GPU with no network: vLLM installed from the parts scripts/offline_vllm.py
# packed (docs/offline-vllm.md), the embedded tiny MiniMax-M2 written as a model directory, a cuda stack.
#   bash scripts/device/vllm_gpu.sh STAGE...     (from the repository root)
# Stages, each under its own time limit, a failing one never stopping the next:
#   setup       install vLLM from PARTS into SITE (once), write the model, two stacks (memory 0.9 and 0.4) and the
#               series directories (base, graph, branch, flagged, numerics; scripts/demo_series.py)
#   decode      `decode --stack` one shape with --accept-gate (pins beside the stack), then again (the gate passes),
#               and `cache-key show` of that run's record
#   cachekey    `cache-key measure --stack` (one start on an empty cache)
#   kernels     moe-down's vllm variant beside triton and triton-htile; the allreduce vllm path with one rank
#   aa|slow     `compare base base` / `compare base graph` on the 0.9 stack (auto: alternate)
#   together    `compare base graph` on the 0.4 stack (auto: together)
#   branch      `compare base branch` on the 0.9 stack: speed quiet, compile-cache key named
#   flag        `compare base flagged --b-env FLAG=1` (in-graph work on: slower), then `compare base flagged` (off);
#               flag-on and flag-off run one of them (each up to LIMIT seconds, 590)
#   numerics    `compare base numerics`: other tokens, the same work (B's gate fails, nothing pinned)
#   plan        `compare base flagged --b-env FLAG=1 --plan`: what the measurement will cost, before it runs
#   serve       `serve --stack` at 1 and 4 requests, beside `vllm bench serve`
#   standin     the MiniMax M2.7 INT4 stand-in (LAYERS layers, 30; docs/standin.md) written with its stack, then
#               `decode --stack` one shape (SHAPE, p512n256) once cold and once warm with --accept-gate
#   standin-starts  one cold start, then RUNS (10) warm starts of the stand-in on one compile cache, SHAPE_STARTS
#               (p512n64), 8 timed calls each: start cost and the spread between single starts of identical code
#   standin-profile  the device's busy time a decode token against the wall time a token, the engine in the
#               profiling process (scripts/device/standin_profile.py, SHAPE_PROFILE p512n64), its own compile cache
# Environment: PARTS (the folder of the parts and parts.json; setup needs it until SITE holds vLLM), EXTRA (more
# wheels for SITE), WORK (models, stacks, series, caches, logs in WORK/logs; default results/vllm-gpu/work), SITE
# (WORK/site), OUT (results/vllm-gpu: one .tgz a call of every log and JSON it wrote), PYTHON (python3), CMP (alt or
# together: the stack of the flag, numerics and plan stages; alt), ARGS (more compare options for flag and numerics,
# e.g. --max-starts 4), BUDGET (compare minutes, 4), REPS and SIZE (the graph series' work, 8 and 64; WORK_MS
# instead of REPS: as many SIZE x SIZE products as take about that many GPU milliseconds a step, timed here first),
# LAYERS, SHAPE and SHAPE_PROFILE (the stand-in's layers, its decode shape and its profiled shape: 30, p512n256,
# p512n64).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-$ROOT/results/vllm-gpu}; WORK=${WORK:-$ROOT/results/vllm-gpu/work}; SITE=${SITE:-$WORK/site}
PARTS=${PARTS:-}; PY=${PYTHON:-python3}; LOGS=$WORK/logs; mkdir -p "$OUT" "$WORK" "$LOGS"
BUDGET=${BUDGET:-4}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 B70BENCH_HOME=$WORK/home B70BENCH_BACKEND=cuda
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
export B70BENCH_COMMIT=${B70BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
B="$PY -m b70bench"
ALT=$WORK/alt.toml; TOG=$WORK/together.toml; S=$WORK/series
CMP=$WORK/${CMP:-alt}.toml  # the stack of the flag, numerics and plan stages: alt (one engine at a time) or together

LAYERS=${LAYERS:-30}; SI=$WORK/standin-$LAYERS.toml  # the stand-in's stack; its model: $WORK/standin-$LAYERS

stage() {  # NAME LIMIT_S COMMAND...: one logged, time-limited step
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name ($(date -u +%T), limit ${limit} s): $*"
  timeout -k 20 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-25}" "$LOGS/$name.log"
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"
}

stack_file() {  # PATH MEMORY_FRACTION [MORE_LINES]
  cat > "$1" <<EOF
name = "tiny-$(basename "$1" .toml)-cuda"
backend = "cuda"
devices = [0]
model = "./tiny-model"
memory_fraction = $2
shapes = ["p128n128"]
start_timeout_s = 600

[engine_args]
attention_backend = "TRITON_ATTN"
${3:-}
EOF
}

setup() {
  if [[ ! -d $SITE/vllm ]]; then
    [[ -n $PARTS ]] || { echo "no vLLM in $SITE: set PARTS to the folder of the parts (docs/offline-vllm.md)"; return 2; }
    $PY scripts/offline_vllm.py install --parts "$PARTS" --target "$SITE" || return 1
  fi
  # Wheels sent beside an older bundle (one that left out xgrammar, which vLLM imports when an engine starts).
  if [[ -n ${EXTRA:-} ]] && compgen -G "$EXTRA/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$EXTRA"/*.whl || return 1
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, triton, vllm; print("torch", torch.__version__, "triton", triton.__version__,
                                          "vllm", vllm.__version__, "gpu", torch.cuda.get_device_name(0))' || return 1
  [[ -d $WORK/tiny-model ]] || $B stack write-model "$WORK/tiny-model" || return 1
  # Two engines at once: vLLM 0.20.1 otherwise reserves its CUDA-graph memory estimate out of each one's share.
  stack_file "$ALT" 0.9; stack_file "$TOG" 0.4 $'[env]\nVLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS = "0"'
  local reps=${REPS:-8}
  if [[ -n ${WORK_MS:-} ]]; then  # reps of SIZE x SIZE products for about WORK_MS of GPU time a step (two layers)
    reps=$($PY - "$WORK_MS" "${SIZE:-64}" <<'PYEOF'
import sys, torch
ms, n = float(sys.argv[1]), int(sys.argv[2])
m = torch.ones(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(20):
    m = torch.tanh(m @ m)
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
a.record()
for _ in range(200):
    m = torch.tanh(m @ m)
b.record(); torch.cuda.synchronize()
each = a.elapsed_time(b) / 200
print(max(1, round(ms / (2 * each))))
print(f"one {n}x{n} bf16 product and tanh: {each * 1000:.1f} us", file=sys.stderr)
PYEOF
) || return 1
  fi
  $PY scripts/demo_series.py "$S" --reps "$reps" --size "${SIZE:-64}" || return 1
  $B stack show "$ALT"; $B stack show "$TOG"
}

standin_write() {  # the stand-in and its stack, once per layer count (weights are drawn at each load, not here)
  [[ -f $SI ]] || $B stack write-standin "$WORK/standin-$LAYERS" --layers "$LAYERS" --stack "$SI" \
    --shape "${SHAPE:-p512n256}" || return 1
  $B stack show "$SI"
}

touch "$WORK/.call"
for st in "$@"; do
  case $st in
    setup) echo "== setup ($(date -u +%T))"; setup > "$LOGS/setup.log" 2>&1; echo "== setup: rc=$?"
           tail -n 30 "$LOGS/setup.log" ;;
    decode)
      stage decode-pin 300 $B decode --stack "$ALT" --runs 1 --no-cold --iterations 3 --accept-gate \
        --json "$LOGS/decode-pin.json" --out-dir "$WORK/decode-pin"
      stage decode 300 $B decode --stack "$ALT" --runs 1 --no-cold --iterations 10 --json "$LOGS/decode.json" \
        --out-dir "$WORK/decode"
      stage cachekey-show 120 $B cache-key show "$LOGS/decode.json" ;;
    cachekey) stage cachekey-measure 400 $B cache-key measure --stack "$ALT" --json "$LOGS/cachekey.json" ;;
    kernels)
      stage moe-down 300 $B moe-down --variants vllm triton triton-htile --tokens 1 16 --tp 4 --graph \
        --json "$LOGS/moe-down.json"
      stage allreduce-vllm 200 $B allreduce --path vllm --world-size 1 --sizes 8 6K 1M --json "$LOGS/allreduce.json" ;;
    aa) stage compare-aa 590 $B compare "$S/base" "$S/base" --stack "$ALT" --budget "$BUDGET" \
          --json "$LOGS/compare-aa.json" --out-dir "$WORK/compare-aa" ;;
    slow) stage compare-slow 590 $B compare "$S/base" "$S/graph" --stack "$ALT" --budget "$BUDGET" \
          --json "$LOGS/compare-slow.json" --out-dir "$WORK/compare-slow" ;;
    together) stage compare-together 590 $B compare "$S/base" "$S/graph" --stack "$TOG" --budget "$BUDGET" \
          --json "$LOGS/compare-together.json" --out-dir "$WORK/compare-together" ;;
    branch) stage compare-branch 590 $B compare "$S/base" "$S/branch" --stack "$ALT" --budget "$BUDGET" \
          --json "$LOGS/compare-branch.json" --out-dir "$WORK/compare-branch" ;;
    flag|flag-on|flag-off)
      [[ $st == flag-off ]] || stage compare-flag-on "${LIMIT:-590}" $B compare "$S/base" "$S/flagged" \
        --b-env VLLM_B70BENCH_FLAGGED_WORK=1 --stack "$CMP" ${ARGS:-} --budget "$BUDGET" \
        --json "$LOGS/compare-flag-on.json" --out-dir "$WORK/compare-flag-on"
      [[ $st == flag-on ]] || stage compare-flag-off "${LIMIT:-590}" $B compare "$S/base" "$S/flagged" \
        --stack "$CMP" ${ARGS:-} --budget "$BUDGET" --json "$LOGS/compare-flag-off.json" \
        --out-dir "$WORK/compare-flag-off" ;;
    numerics) stage compare-numerics "${LIMIT:-590}" $B compare "$S/base" "$S/numerics" --stack "$CMP" ${ARGS:-} \
          --budget "$BUDGET" --json "$LOGS/compare-numerics.json" --out-dir "$WORK/compare-numerics" ;;
    plan) stage compare-plan 120 $B compare "$S/base" "$S/flagged" --b-env VLLM_B70BENCH_FLAGGED_WORK=1 --stack "$CMP" \
          --plan ;;
    serve) stage serve 590 $B serve --stack "$ALT" --concurrency 1 4 --anchor-rounds 2 --json "$LOGS/serve.json" \
          --pytorch-json "$LOGS/serve.pytorch.json" --out-dir "$WORK/serve" ;;
    standin)
      standin_write > "$LOGS/standin-write.log" 2>&1 || { cat "$LOGS/standin-write.log"; continue; }
      # The default runs: one cold start (an empty compile cache), then one warm; the pin needs both to agree.
      stage standin-decode 540 $B decode --stack "$SI" --shapes "${SHAPE:-p512n256}" --runs 1 --iterations 5 \
        --accept-gate --json "$LOGS/standin-decode.json" --out-dir "$WORK/standin-decode" ;;
    standin-profile)
      standin_write > "$LOGS/standin-write.log" 2>&1 || { cat "$LOGS/standin-write.log"; continue; }
      stage standin-profile 540 env VLLM_CACHE_ROOT="$WORK/standin-profile-cache" $PY scripts/device/standin_profile.py \
        "$SI" --shape "${SHAPE_PROFILE:-p512n64}" --json "$LOGS/standin-profile.json" ;;
    standin-starts)
      standin_write > "$LOGS/standin-write.log" 2>&1 || { cat "$LOGS/standin-write.log"; continue; }
      stage standin-starts "${LIMIT:-3000}" $B decode --stack "$SI" --shapes "${SHAPE_STARTS:-p512n64}" \
        --runs "${RUNS:-10}" --iterations 8 --json "$LOGS/standin-starts.json" --out-dir "$WORK/standin-starts" ;;
    *) echo "unknown stage $st (setup decode cachekey kernels aa slow together branch flag flag-on flag-off numerics" \
         "plan serve standin standin-profile standin-starts)"
       exit 2 ;;
  esac
done
# Everything this call wrote (stage logs, JSON, the engines' own logs) in one file, easy to carry off the machine.
find "$WORK" -path "$SITE" -prune -o -type f -newer "$WORK/.call" -size -20M \( -name '*.log' -o -name '*.json' \) \
  -print | tar -czf "$OUT/vllm-gpu-${1:-none}.tgz" -T - 2>/dev/null
ls -la "$OUT"
