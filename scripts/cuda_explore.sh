#!/usr/bin/env bash
# Kernel tuning on the GPU machine, in one device call: builds the kernels and cuda_bench
# (scripts/cuda_device.sh build, with -lineinfo), then
#   - for each VARIANTS entry "name:NVCC_DEFINES" (';'-separated), rebuilds the forward and
#     backward with those defines and times them with cuda_bench --no-mixed, e.g.
#     -DREWIND_FWD64_TILE=warps(4)+m16(1)+min_blocks(3)+q_in_smem (the tiles and the other
#     knobs: kernels/cuda/attention_forward_config.cuh, attention_backward_config.cuh);
#   - with PROFILE=1, runs Nsight Compute on one launch of each kernel named in KERNELS
#     ("regex@shape[@skip]" list; shape 0 = B8 H12 T1024 D64, 1 = B2 H16 T4096 D128; skip:
#     matching launches to pass over, default 3, e.g. 31 = the stabilized run) and writes the
#     details page and the per-instruction source page under $OUT/ncu/.
# Usage: VARIANTS='a:-DX=1;b:-DX=2' PROFILE=1 bash scripts/cuda_explore.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-/tmp/rewind-explore}
OUT=${OUT:-$BUILD/out}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$BUILD" "$OUT"
cd "$ROOT"
NVCC_FLAGS="-lineinfo" BUILD="$BUILD" OUT="$OUT" bash scripts/cuda_device.sh build
TORCH=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
CUDA_HOME=$(dirname "$(dirname "$NVCC")")

echo "== base"
"$BUILD/cuda_bench" --no-mixed 2>&1 | tee "$OUT/bench_base.log" | grep -vE "^$"
IFS=';' read -ra VS <<< "${VARIANTS:-}"
NAMES=(); DEFS=()
for v in "${VS[@]}"; do
  [[ -n "$v" ]] && { NAMES+=("${v%%:*}"); DEFS+=("${v#*:}"); }
done
# Every variant's forward and backward compile at once (the machine has 16 cores); then each is
# linked and timed in turn.
for i in "${!NAMES[@]}"; do
  name=${NAMES[$i]}; defs=${DEFS[$i]}
  d="$BUILD/v_$name"; mkdir -p "$d"
  for f in attention_forward attention_backward; do
    # shellcheck disable=SC2086
    "$NVCC" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --resource-usage -lineinfo $defs \
      -I"$ROOT" -c kernels/cuda/$f.cu -o "$d/$f.o" > "$d/nvcc_$f.log" 2>&1 &
  done
done
wait || true
for i in "${!NAMES[@]}"; do
  name=${NAMES[$i]}; defs=${DEFS[$i]}
  d="$BUILD/v_$name"
  cat "$d"/nvcc_*.log > "$d/nvcc.log"
  [[ -f "$d/attention_forward.o" && -f "$d/attention_backward.o" ]] || { cat "$d/nvcc.log"; continue; }
  ar rcs "$d/lib.a" "$d"/attention_{forward,backward}.o "$BUILD"/attention_{simt,plan,split}.o
  g++ "$BUILD/cuda_bench.o" "$d/lib.a" -L"$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -Wl,--no-as-needed \
    -ltorch -ltorch_cuda -ltorch_cpu -lc10_cuda -lc10 -L"$CUDA_HOME/lib64" -lcudart -o "$d/cuda_bench"
  echo "== variant $name ($defs)"
  grep -A2 -E "ELi[01]EEE|flash_dq|flash_dkdv" "$d/nvcc.log" | grep -oE "kernelILi[0-9]+(ELi[01])?|[0-9]+ bytes spill stores|Used [0-9]+ reg" | paste -sd' ' | sed 's/kernelILi/\n  D/g'; echo
  "$d/cuda_bench" --no-mixed 2>&1 | tee "$OUT/bench_$name.log" | grep -E "rewind_st|sdpa|alternat"
  if [[ "${TEST_VARIANTS:-0}" == 1 ]]; then  # the CUDA tests against this variant's kernels
    g++ -std=c++17 -O2 -ffp-contract=off -fopenmp -I"$ROOT" -I"$CUDA_HOME/include" \
      kernels/attention_reference.cpp kernels/attention_forward_cpu.cpp kernels/attention_backward_cpu.cpp \
      tests/cuda/attention_cuda_test.cpp tests/cuda/cuda_test_util.cpp "$d/lib.a" \
      -L"$CUDA_HOME/lib64" -lcudart -lgtest -lgtest_main -lpthread -o "$d/attention_cuda_test"
    "$d/attention_cuda_test" > "$OUT/test_$name.log" 2>&1 && echo "  tests: $(tail -1 "$OUT/test_$name.log")" ||
      { echo "  tests FAILED:"; grep -E "FAILED|Failure|error" "$OUT/test_$name.log" | head -20; }
  fi
done

if [[ "${PROFILE:-0}" == 1 ]]; then
  mkdir -p "$OUT/ncu"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
  [[ -z "$NCU" ]] && { echo "no ncu"; exit 0; }
  IFS=' ' read -ra KS <<< "${KERNELS:-flash_forward_kernel@0 flash_fwd_kernel@0}"
  for k in "${KS[@]}"; do
    IFS=@ read -r re shape skip <<< "$k"; skip=${skip:-3}; tag="${re//[^a-zA-Z0-9]/_}_${shape}_$skip"
    BENCH="$BUILD/cuda_bench"; [[ -n "${PROFILE_VARIANT:-}" ]] && BENCH="$BUILD/v_$PROFILE_VARIANT/cuda_bench"
    "$NCU" --clock-control none -k "regex:$re" --launch-skip "$skip" --launch-count 1 --set full \
      --import-source yes -f -o "$OUT/ncu/$tag" "$BENCH" --shape "$shape" --no-mixed \
      > "$OUT/ncu/$tag.run.log" 2>&1 || { tail -5 "$OUT/ncu/$tag.run.log"; continue; }
    "$NCU" -i "$OUT/ncu/$tag.ncu-rep" --page details > "$OUT/ncu/$tag.details.txt" 2>&1 || true
    "$NCU" -i "$OUT/ncu/$tag.ncu-rep" --page source --csv --print-source sass \
      > "$OUT/ncu/$tag.sass.csv" 2>&1 || true
    echo "== ncu $tag: $(grep -E 'Duration|Achieved Occupancy|Registers Per' "$OUT/ncu/$tag.details.txt" | head -4 | tr -s ' ' | paste -sd'|')"
    rm -f "$OUT/ncu/$tag.ncu-rep"
  done
  # The device tool returns a limited number of files: one archive.
  tar -C "$OUT" -czf "$OUT/ncu.tgz" ncu && rm -rf "$OUT/ncu"
fi
