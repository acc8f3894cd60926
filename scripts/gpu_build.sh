#!/usr/bin/env bash
# On the lent GPU machine (Ubuntu, nvcc 13, pip torch 2.11+cu130): unpack the carried Debian
# .debs (SQLite, nlohmann-json, cxxopts, gtest: see docs/cuda.md), configure
# with -DREWIND_CUDA=ON against pip torch's LibTorch, build, and run the cuda-labelled tests.
# Usage: bash scripts/gpu_build.sh [ctest args]   (BUILD, OUT honoured; logs under $OUT)
#        TARGET=rewind bash scripts/gpu_build.sh    (that target only, no tests: a quick rebuild)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
OUT=${OUT:-$BUILD}
mkdir -p "$OUT"
D=$ROOT/.gpu-deps/root
mkdir -p "$D"
for f in "$ROOT"/.gpu-deps/*.deb; do dpkg -x "$f" "$D"; done
TORCH_PREFIX=$(python3 -c "import torch;print(torch.utils.cmake_prefix_path)")
export CMAKE_PREFIX_PATH=$TORCH_PREFIX:$D/usr
export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DREWIND_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
  -DREWIND_PYTHON3="$(command -v python3)" \
  -DSQLite3_INCLUDE_DIR="$D/usr/include" \
  -DSQLite3_LIBRARY="$D/usr/lib/x86_64-linux-gnu/libsqlite3.so" > "$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
# Keep going past a failing target so one broken test does not hide the rest; report it.
KEEP=(-k); [[ ${#GEN[@]} -gt 0 ]] && KEEP=(-k 0)
TGT=(); [[ -n "${TARGET:-}" ]] && TGT=(--target "$TARGET")
if ! cmake --build "$BUILD" -j "$(nproc)" "${TGT[@]}" -- "${KEEP[@]}" > "$OUT/build.log" 2>&1; then
  echo "== build had errors:"; grep -E "error|FAILED" "$OUT/build.log" | head -40
  [[ -x "$BUILD/rewind" ]] || exit 1
fi
echo "== built $BUILD"
[[ -n "${TARGET:-}" ]] && exit 0
cd "$BUILD" && ctest -L cuda --output-on-failure "$@" 2>&1 | tee "$OUT/ctest_cuda.log" | tail -30
