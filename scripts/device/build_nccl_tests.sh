#!/usr/bin/env bash
# Build nccl-tests' all_reduce_perf (https://github.com/NVIDIA/nccl-tests, no MPI) against the NCCL that torch
# uses, and print the binary's path on the last line (allreduce.sh and allreduce_abab.sh call it):
#   bash scripts/device/build_nccl_tests.sh /path/to/nccl-tests [BUILD_DIR]
# BUILD_DIR (the objects and the binary) defaults to build/nccl-tests in this repository (git-ignored).
# Run the binary with LD_LIBRARY_PATH=BUILD_DIR/nccl/lib (or $NCCL_HOME/lib when that was set).
# NCCL: $NCCL_HOME if set (include/ and lib/), else the pip package nvidia-nccl-* that CUDA torch wheels bring
# (it ships libnccl.so.2 only, so BUILD_DIR/nccl links it as libnccl.so for the linker). CUDA: $CUDA_HOME, else
# /usr/local/cuda, else the nvcc on PATH. NVCC_GENCODE defaults to GPU 0's architecture (from torch).
# PYTHON: the interpreter whose torch and NCCL to use (default python3).
set -euo pipefail
usage() { echo "usage: bash scripts/device/build_nccl_tests.sh NCCL_TESTS_DIR [BUILD_DIR]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
[[ -f $1/src/common.h ]] || { echo "$1: not an nccl-tests source tree (no src/common.h)" >&2; usage; }
SRC=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${2:-$ROOT/build/nccl-tests}
mkdir -p "$BUILD"; BUILD=$(cd "$BUILD" && pwd)
PY=${PYTHON:-python3}
if [[ -z ${NCCL_HOME:-} ]]; then
  PKG=$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])') ||
    { echo "no NCCL: set NCCL_HOME, or install torch's CUDA wheel (it brings nvidia-nccl-*)" >&2; exit 1; }
  NCCL_HOME=$BUILD/nccl; rm -rf "$NCCL_HOME"; mkdir -p "$NCCL_HOME/lib"
  ln -s "$PKG/include" "$NCCL_HOME/include"
  for f in "$PKG"/lib/libnccl.so*; do ln -s "$f" "$NCCL_HOME/lib/"; done
  [[ -e $NCCL_HOME/lib/libnccl.so ]] || ln -s "$PKG/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so"
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -x $CUDA_HOME/bin/nvcc ]]; then
  NVCC=$(command -v nvcc) || { echo "nvcc not found: set CUDA_HOME or put nvcc on PATH" >&2; exit 1; }
  CUDA_HOME=$(dirname "$(dirname "$NVCC")")
fi
GENCODE=${NVCC_GENCODE:-$("$PY" -c 'import torch; a = "%d%d" % torch.cuda.get_device_capability(0)
print(f"-gencode=arch=compute_{a},code=sm_{a}")')}
echo "nccl-tests $(grep -o 'NCCL_TESTS_VERSION.*' "$SRC/src/common.h" | head -1); NCCL_HOME=$NCCL_HOME;" \
  "CUDA_HOME=$CUDA_HOME ($("$CUDA_HOME/bin/nvcc" --version | tail -1)); $GENCODE" >&2
make -s -j"$(nproc)" -C "$SRC/src" MPI=0 NCCL_HOME="$NCCL_HOME" CUDA_HOME="$CUDA_HOME" NVCC_GENCODE="$GENCODE" \
  BUILDDIR="$BUILD" "$BUILD/all_reduce_perf" >&2
echo "$BUILD/all_reduce_perf"
