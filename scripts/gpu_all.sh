#!/usr/bin/env bash
# On a GPU machine, in one call: build with CUDA and run the cuda-labelled tests, the kernel
# benchmark (TFLOP/s vs PyTorch SDPA flash; then one row per head dim), the gpt2-small training
# benchmark (tokens/s vs the sdpa mode, recording overhead, phase times), the step under the FP32
# probe plans and, with PROFILE=1, the step's kernel profile.
# Everything is logged under $OUT (default: the build folder). Stops at the first failure.
# Usage: [BUILD=dir] [ROUNDS=n] [PROFILE=1] [SKIP_BUILD=1] bash scripts/gpu_all.sh
# SKIP_BUILD=1: $BUILD was built and its cuda tests passed by scripts/gpu_build.sh on this
# machine already (the device tool's 10-minute calls: build in one, measure in the next).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export BUILD=${BUILD:-$ROOT/build-gpu}
export OUT=${OUT:-$BUILD}
mkdir -p "$OUT"
if [[ "${SKIP_BUILD:-0}" == 1 ]]; then
  [[ -x "$BUILD/rewind" ]] || { echo "SKIP_BUILD=1 but no $BUILD/rewind: run scripts/gpu_build.sh first"; exit 1; }
  echo "== build + ctest -L cuda: skipped (SKIP_BUILD=1, $BUILD)"
else
  echo "== build + ctest -L cuda (logs: $OUT/build.log, $OUT/ctest_cuda.log)"
  bash "$ROOT/scripts/gpu_build.sh" > "$OUT/gpu_build.txt" 2>&1 || { tail -40 "$OUT/gpu_build.txt"; exit 1; }
  tail -4 "$OUT/ctest_cuda.log"
  grep -q "100% tests passed" "$OUT/ctest_cuda.log" || { echo "cuda tests failed"; exit 1; }
fi
echo "== kernel benchmark"
"$BUILD/experiments/cuda_bench/cuda_bench" 2>&1 | tee "$OUT/cuda_bench.txt"
echo "== kernel benchmark per head dim (full tables: $OUT/cuda_bench_head_dims.txt)"
"$BUILD/experiments/cuda_bench/cuda_bench" --head-dims --no-mixed > "$OUT/cuda_bench_head_dims.txt" 2>&1
sed -n '/^head dims,/,$p' "$OUT/cuda_bench_head_dims.txt"
echo "== gpt2-small training benchmark"
bash "$ROOT/scripts/gpu_bench.sh" "$BUILD" 2>&1 | tee "$OUT/gpu_bench.txt"
echo "== FP32 plans over the default (3xTF32 and simt FP32 GEMMs)"
MODE=plans ROUNDS=${PLAN_ROUNDS:-2} STEPS=12 bash "$ROOT/scripts/gpu_bench.sh" "$BUILD" 2>&1 | tee "$OUT/gpu_bench_plans.txt"
if [[ "${PROFILE:-0}" == 1 ]]; then
  echo "== step profile"
  bash "$ROOT/scripts/gpu_profile_step.sh" "$BUILD" 2>&1 | tee "$OUT/profile.txt" | head -40
fi
