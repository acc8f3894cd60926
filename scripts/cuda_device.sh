#!/usr/bin/env bash
# Builds and runs the CUDA attention test and benchmark on the GPU machine without the full
# CMake build (which needs SQLite there): nvcc for the kernels, g++ for the test and the bench.
# Usage: scripts/cuda_device.sh [build|test|bench|all]   (logs under $OUT when set)
#   NVCC_FLAGS   extra nvcc flags for every kernel (e.g. -lineinfo for a profile)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-all}
BUILD=${BUILD:-$ROOT/build-cuda-dev}
LOG=${OUT:-$BUILD}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=$(dirname "$(dirname "$NVCC")")
mkdir -p "$BUILD" "$LOG"
cd "$ROOT"

for f in attention_forward attention_backward attention_simt attention_plan attention_split; do
  echo "$NVCC -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --resource-usage ${NVCC_FLAGS:-} -I$ROOT -c kernels/cuda/$f.cu -o $BUILD/$f.o"
done | xargs -P 4 -I{} sh -c '{}' > "$LOG/nvcc.log" 2>&1 || { cat "$LOG/nvcc.log"; exit 1; }
# The register and spill summary (|| true: head closing the pipe early is no failure).
grep -E "spill|registers" "$LOG/nvcc.log" | sort | uniq -c | head -20 || true
rm -f "$BUILD/librewind_cuda_kernels.a"
ar rcs "$BUILD/librewind_cuda_kernels.a" "$BUILD"/attention_{forward,backward,simt,plan,split}.o

g++ -std=c++17 -O2 -ffp-contract=off -fopenmp -I"$ROOT" -I"$CUDA_HOME/include" \
  kernels/attention_reference.cpp kernels/attention_forward_cpu.cpp kernels/attention_backward_cpu.cpp \
  tests/cuda/attention_cuda_test.cpp tests/cuda/attention_fp32_test.cpp tests/cuda/cuda_test_util.cpp \
  "$BUILD/librewind_cuda_kernels.a" -L"$CUDA_HOME/lib64" -lcudart -lgtest -lgtest_main -lpthread \
  -o "$BUILD/attention_cuda_test"

if [[ "$MODE" == bench || "$MODE" == all || "$MODE" == build ]]; then
  TORCH=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
  g++ -std=c++17 -O2 -D_GLIBCXX_USE_CXX11_ABI=1 -I"$ROOT" -I"$CUDA_HOME/include" \
    -I"$TORCH/include" -I"$TORCH/include/torch/csrc/api/include" \
    -c experiments/cuda_bench/cuda_bench.cpp -o "$BUILD/cuda_bench.o"
  g++ "$BUILD/cuda_bench.o" "$BUILD/librewind_cuda_kernels.a" \
    -L"$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -Wl,--no-as-needed -ltorch -ltorch_cuda -ltorch_cpu \
    -lc10_cuda -lc10 -L"$CUDA_HOME/lib64" -lcudart -o "$BUILD/cuda_bench"
fi
[[ "$MODE" == build ]] && exit 0
status=0
if [[ "$MODE" == test || "$MODE" == all ]]; then
  "$BUILD/attention_cuda_test" 2>&1 | tee "$LOG/test.log" | grep -vE "^\[ +(RUN|OK) " | tail -60 || status=1
fi
if [[ "$MODE" == bench || "$MODE" == all ]]; then
  "$BUILD/cuda_bench" 2>&1 | tee "$LOG/bench.log" || status=1
fi
exit $status
