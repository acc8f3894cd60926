#!/usr/bin/env bash
# The README's test command: checks that git tracks no compiled or oversized file
# (scripts/check_tree.sh), installs what is missing, checks the docs' relative links
# (scripts/check_links.py), builds, runs the whole ctest suite.
# On a machine with nvcc (CI has /usr/local/cuda, no GPU) it also compiles kernels/cuda/*.cu
# for sm_90a and builds their test (no LibTorch needed), so a broken kernel or kernel test never
# lands unseen; without a GPU that test's cases skip, which the run shows. After ctest, the
# Python tests under PyPI's torch 2.x (scripts/test_torch2.sh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
echo "== checking the tracked files"
bash "$REWIND_ROOT/scripts/check_tree.sh"
install_deps
echo "== checking the relative links of README.md and docs/ (scripts/check_links.py)"
python3 "$REWIND_ROOT/scripts/check_links.py"
echo "== the browser test's pip packages (playwright, axe-playwright-python)"
bash "$REWIND_ROOT/tests/browser/install.sh"
build_rewind
NVCC="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
if [[ -x "$NVCC" ]]; then
  echo "== compiling CUDA kernels for sm_90a and their test with $NVCC"
  cmake -S "$REWIND_ROOT" -B "$BUILD_DIR-cuda-check" -G Ninja -DREWIND_CUDA_KERNELS_ONLY=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
  cmake --build "$BUILD_DIR-cuda-check" -j "$(nproc)"
  rc=0
  (cd "$BUILD_DIR-cuda-check" && ctest --output-on-failure "$@" > ctest.log) || rc=$?
  grep -E "tests passed|Failed|Skipped" "$BUILD_DIR-cuda-check/ctest.log" | grep -v "^\s*[0-9]* - " | sed 's/^/   /' || true
  [[ $rc == 0 ]] || { cat "$BUILD_DIR-cuda-check/ctest.log"; exit "$rc"; }
else
  echo "== nvcc not found: skipping the CUDA compile check"
fi
echo "== running tests"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" "$@")
# The Python package under PyPI's torch 2.x (the ctest above runs it under Debian's 1.13); not
# when ctest was given a selection of its own.
if [[ $# -eq 0 ]]; then
  echo "== the Python package under PyPI's torch 2.x (scripts/test_torch2.sh)"
  REWIND_BIN="$BUILD_DIR/rewind" bash "$REWIND_ROOT/scripts/test_torch2.sh"
fi
