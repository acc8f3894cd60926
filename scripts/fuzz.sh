#!/usr/bin/env bash
# Fuzzes every parser a user's text or file reaches (fuzz/fuzz_*.cpp): builds the targets with
# clang + libFuzzer + ASan + UBSan into build-fuzz/ and runs each for SECONDS (default 60).
#   bash scripts/fuzz.sh 60              # all targets, 60 s each
#   bash scripts/fuzz.sh 30 plan store   # only these
# Each run starts from the committed seeds (fuzz/corpus/NAME) and the crash regressions
# (fuzz/regressions/NAME) plus what earlier runs found (build-fuzz/corpus/NAME). A crash, hang
# (> 10 s per input), leak, sanitizer report or violated property fails the script; the input
# is left in build-fuzz/artifacts/NAME/; copy it to fuzz/regressions/NAME/ once fixed, where
# ctest (fuzz_NAME_regressions) replays it.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
SECONDS_EACH="${1:-60}"
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(plan predicate capture config plan_schedule run_meta store blob nanogpt)
FUZZ_DIR="${FUZZ_BUILD_DIR:-$REWIND_ROOT/build-fuzz}"

install_deps
echo "== building fuzz targets (clang-14, libFuzzer, ASan, UBSan) in $FUZZ_DIR"
cmake -S "$REWIND_ROOT/fuzz" -B "$FUZZ_DIR" -G Ninja -DCMAKE_C_COMPILER=clang-14 \
  -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$FUZZ_DIR" -j "$(nproc)" >/dev/null

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
failed=()
printf '%-10s %8s %10s %8s %8s %8s\n' target seconds execs exec/s cov corpus
for t in "${TARGETS[@]}"; do
  seeds="$REWIND_ROOT/fuzz/corpus/$t" regress="$REWIND_ROOT/fuzz/regressions/$t"
  work="$FUZZ_DIR/corpus/$t" art="$FUZZ_DIR/artifacts/$t"
  mkdir -p "$seeds" "$regress" "$work" "$art"
  log="$FUZZ_DIR/$t.log"
  rc=0
  "$FUZZ_DIR/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$art/" \
    "$work" "$seeds" "$regress" >"$log" 2>&1 || rc=$?
  execs=$(grep -oP 'stat::number_of_executed_units:\s*\K\d+' "$log" | tail -1 || true)
  speed=$(grep -oP 'stat::average_exec_per_sec:\s*\K\d+' "$log" | tail -1 || true)
  cov=$(grep -oP '(?<=cov: )\d+' "$log" | tail -1 || echo 0)
  printf '%-10s %8s %10s %8s %8s %8s\n' "$t" "$SECONDS_EACH" "${execs:-0}" "${speed:-0}" "${cov:-0}" \
    "$(find "$work" -type f | wc -l)"
  if [[ $rc != 0 ]]; then
    failed+=("$t")
    echo "== fuzz_$t FAILED (exit $rc); input in $art, log $log:"
    grep -E 'ERROR|SUMMARY|violated|runtime error|Test unit written' "$log" | head -20
  fi
done
if ((${#failed[@]})); then
  echo "== fuzzing found problems in: ${failed[*]}"
  exit 1
fi
echo "== no crashes, hangs, leaks or sanitizer reports"
