#!/usr/bin/env bash
# Stochastic rounding (qk=sr, pv=sr, acc=sr) on the lent GPU machine, in one call (~8 minutes
# cold): builds the CUDA kernels' test, cuda_bench and the GPU record/replay test with
# scripts/gpu_build.sh (-DREWIND_CUDA=ON against that machine's pip torch, the carried
# .gpu-deps/*.deb), then runs the sr kernel tests (device vs host bits, CPU-twin agreement per
# head dim, bitwise repeats), `cuda_bench --sr` (sr forward and backward against the same call
# without sr at D64 B8 H12 T1024 and D128 B2 H16 T4096), the GPU record/replay test of an sr
# plan, and what is left of the kernel test suite (no regression elsewhere) while the deadline
# allows.
# Everything lands under $OUT: log.txt (each stage, its exit code and seconds), bench_sr.txt
# (the table) and all.tgz (env, build, test logs).
# Usage, from the repository root, carrying .gpu-deps:   OUT=/some/dir bash experiments/stochastic_rounding/device.sh
# Environment: BUILD (build-gpu), SKIP_BUILD=1 (use BUILD as it is), DEADLINE_S (560: seconds
# after the start by which the stages must end; the whole kernel suite runs only if time is left),
# REST=0 (leave the rest of the kernel suite out), WAIT_FOR (a file whose existence says the GPU
# is free for the tests and the benchmark).
set -u
T0=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/stochastic_rounding_out}
BUILD=${BUILD:-$ROOT/build-gpu}
DEADLINE=$((T0 + ${DEADLINE_S:-560}))
mkdir -p "$OUT"
LOG=$OUT/log.txt
log() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$LOG"; }
# stage NAME LIMIT CMD...: runs CMD for at most LIMIT seconds (and never past the deadline; a
# shell function, the build, runs to its end), its output in $OUT/NAME.log, and logs its exit
# code and wall time.
stage() {
  local name=$1 limit=$2 t=$(date +%s) rc left
  shift 2
  left=$((DEADLINE - t))
  ((limit > left)) && limit=$left
  if ((limit < 15)); then
    log "skip $name: ${left} s left before the deadline"
    return 1
  fi
  log "start $name (limit $limit s)"
  if [[ $(type -t "$1") == function ]]; then  # the build: not cut (a half-built tree helps no one)
    "$@" > "$OUT/$name.log" 2>&1
  else
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  fi
  rc=$?
  log "end $name: exit $rc, $(($(date +%s) - t)) s"
  return $rc
}

log "stochastic_rounding on $(hostname), $(nproc) cores, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >> "$LOG"

# --- build: the three targets only, each by scripts/gpu_build.sh (its configure, so a build-gpu
# it made is reused; a target that fails to build leaves the others) ---------------------------
build() {
  # Its own names: stage() runs it and reads its local `t` (the start time) afterwards, and a
  # target name there stopped the script under set -u right after the build.
  local rc=0 target
  for target in attention_cuda_test cuda_bench gpu_record_replay_test; do
    TARGET=$target BUILD=$BUILD OUT=$OUT/build_$target bash "$ROOT/scripts/gpu_build.sh" || rc=1
  done
  return $rc
}
if [[ ${SKIP_BUILD:-0} == 1 ]]; then log "build skipped (SKIP_BUILD=1): $BUILD as it is"; else stage build 420 build; fi
# WAIT_FOR=FILE: the GPU is someone else's until FILE exists (a run started beside the build);
# the tests and the benchmark wait for it, at most until the deadline.
while [[ -n ${WAIT_FOR:-} && ! -e $WAIT_FOR ]] && (($(date +%s) < DEADLINE - 60)); do sleep 5; done
[[ -n ${WAIT_FOR:-} ]] && log "GPU free: ${WAIT_FOR} $([[ -e $WAIT_FOR ]] && echo exists || echo 'still missing')"
export LD_LIBRARY_PATH=$ROOT/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export CUBLAS_WORKSPACE_CONFIG=:4096:8
KT=$BUILD/tests/cuda/attention_cuda_test
BENCH=$BUILD/experiments/cuda_bench/cuda_bench
RR=$BUILD/tests/replay/gpu_record_replay_test

# --- the sr tests, the benchmark, the sr record/replay, then the rest of the kernel suite ------
SR_TESTS='StochasticRoundCuda.*:AttentionCudaSr.*:HeadDims/AttentionCudaSrDim.*'
if [[ -x $KT ]]; then
  stage test_sr 240 "$KT" --gtest_filter="$SR_TESTS"
  grep -E "^\[  (PASSED|FAILED) |^\[  SKIPPED \] [0-9]+ test|tests? ran" "$OUT/test_sr.log" | tee -a "$LOG"
else
  log "no $KT: the kernel tests were not built (build.log)"
fi
if [[ -x $BENCH ]]; then
  stage bench_sr 200 "$BENCH" --sr && cp "$OUT/bench_sr.log" "$OUT/bench_sr.txt"
  grep -A 8 "^stochastic rounding" "$OUT/bench_sr.log" | tee -a "$LOG"
else
  log "no $BENCH: cuda_bench was not built (build.log)"
fi
if [[ -x $RR ]]; then
  stage replay_sr 120 "$RR" --gtest_filter='GpuRecordReplay.StochasticRoundingPlanReplaysBitwise'
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/replay_sr.log" | tee -a "$LOG"
fi
if [[ -x $KT && ${REST:-1} == 1 ]]; then
  stage test_rest 300 "$KT" --gtest_filter="-$SR_TESTS"
  grep -E "^\[  (PASSED|FAILED) |tests? ran" "$OUT/test_rest.log" | tee -a "$LOG"
fi
log "done"
# The machine hands back a few files only: everything but the table and the log in one archive.
tar -C "$OUT" -czf "$OUT/all.tgz" --exclude all.tgz --exclude bench_sr.txt --exclude log.txt . &&
  find "$OUT" -type f ! -name all.tgz ! -name bench_sr.txt ! -name log.txt -delete
