#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs the whole ctest suite.
# On a machine with nvcc (CI has /usr/local/cuda, no GPU) it also compiles kernels/cuda/*.cu
# for sm_90 so a broken kernel never lands unseen; CUDA tests themselves need a GPU build.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_deps
build_rewind
NVCC="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
if [[ -x "$NVCC" ]]; then
  echo "== compiling CUDA kernels for sm_90 with $NVCC (compile check only)"
  cmake -S "$REWIND_ROOT" -B "$BUILD_DIR-cuda-check" -G Ninja -DREWIND_CUDA_KERNELS_ONLY=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
  cmake --build "$BUILD_DIR-cuda-check" -j "$(nproc)"
else
  echo "== nvcc not found: skipping the CUDA compile check"
fi
echo "== running tests"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "$@"
