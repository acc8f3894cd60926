#!/usr/bin/env bash
# The Python package under PyPI's torch 2.x, as users run it: installs the pinned torch into the
# python3 on PATH (pip; its Linux wheel brings the CUDA libraries, ~3 GB once per machine; it runs
# on a CPU), builds rewind._C against that torch's LibTorch in build-torch2 (the C++ build and
# its ctest stay on Debian's LibTorch 1.13: experiments/python_record/results/torch2_cpu.txt says
# why), and runs the Python tests that fit CI's time with pytest. The CLI they start is the 1.13
# build's (REWIND_BIN; a separate process). The whole suite under torch 2:
#   TORCH2_TESTS=all bash scripts/test_torch2.sh     (74 tests, ~17 minutes on 2 cores)
# Called by scripts/test.sh after ctest; needs build/rewind. Exit 0 with SKIPPED when pip cannot
# install the pinned torch and transformers (no registry), the tests' exit code otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${TORCH2_PYTHON:-$(command -v python3)}"
TORCH=2.15.0
TRANSFORMERS=5.24.0  # test_instrument.py's Hugging Face models (GPT-2, Llama from small configs, no download)
BUILD="$ROOT/build-torch2"
REWIND_BIN="${REWIND_BIN:-$ROOT/build/rewind}"
[[ -x $REWIND_BIN ]] || { echo "test_torch2: no CLI at $REWIND_BIN (run scripts/test.sh first)"; exit 2; }
have() { "$PY" -c "import sys, torch, numpy, pytest, transformers
sys.exit(torch.__version__.split('+')[0] != '$TORCH' or transformers.__version__ != '$TRANSFORMERS')" 2>/dev/null; }
if ! have; then
  echo "== installing torch $TORCH, transformers $TRANSFORMERS, numpy and pytest for $PY (pip)"
  "$PY" -m pip install --quiet --disable-pip-version-check "torch==$TORCH" "transformers==$TRANSFORMERS" numpy pytest ||
    { echo "SKIPPED: pip could not install torch==$TORCH and transformers==$TRANSFORMERS for $PY"; exit 0; }
  have || { echo "test_torch2: torch $TORCH or transformers $TRANSFORMERS did not import after its install"; exit 1; }
fi
TD="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
echo "== rewind._C against torch $("$PY" -c 'import torch; print(torch.__version__)') in $BUILD"
# The torch folder first: with share/cmake alone TorchConfig may find Debian's libtorch.so; no
# Debian pybind11 or gloo beside torch's own.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DREWIND_TESTS=OFF -DREWIND_PYTHON3="$PY" \
  "-DCMAKE_PREFIX_PATH=$TD;$TD/share/cmake" -DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON -DREWIND_GLOO_INCLUDE=OFF >/dev/null
cmake --build "$BUILD" --target rewind_python -j "$(nproc)"
TESTS=(test_rewind.py test_op.py test_record.py test_doctor.py test_instrument.py test_instrument_bench.py)
[[ ${TORCH2_TESTS:-} == all ]] && TESTS=()
echo "== Python tests under torch $TORCH: ${TESTS[*]:-all}"
cd "$ROOT/tests/python"
PYTHONPATH="$BUILD/python" REWIND_BIN="$REWIND_BIN" "$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}"
