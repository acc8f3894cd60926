#!/usr/bin/env bash
# The instrument benchmark on the lent GPU machine, in one call (~7 minutes): builds rewind._C
# (target rewind_python only, -DREWIND_CUDA=ON, against that machine's pip torch; SQLite and the
# other headers from the carried .gpu-deps/*.deb, as scripts/gpu_build.sh), then runs bench.py
# on GPT-2 small, nanoGPT-style and Hugging Face, eager then compiled, under time limits cut from
# what is left of the deadline. Everything lands under $OUT: log.txt (each stage, its exit code
# and seconds), env.txt, build.log, bench_<part>.log, the parts' CSVs and results.csv /
# results.txt (one table). A failing stage is logged and the next runs.
# Usage, from the repository root, carrying .gpu-deps:   OUT=/some/dir bash experiments/instrument_bench/device.sh
# Environment: BUILD (build-gpu; a warm machine's earlier build is reused), SKIP_BUILD=1 (use
# BUILD as it is), DEADLINE_S (400: seconds after the start by which the benchmark parts must
# end), STEPS (20), WARMUP (5), BENCH_DEVICE (cuda), BENCH_ARGS (more bench.py arguments),
# ONLY (the parts to run, e.g. "nanogpt_compiled hf_compiled"), COMPILED_VARIANTS (the compiled
# parts' variants), INTERLEAVE (1: the variants' steps timed in turns).
# A dry run of the script's logic on a CPU machine with a CPU build of the package:
#   SKIP_BUILD=1 BUILD=build-torch2 BENCH_DEVICE=cpu BENCH_ARGS='--tiny --backend eager' STEPS=2 WARMUP=1 \
#     bash experiments/instrument_bench/device.sh
set -u
T0=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/experiments/instrument_bench
OUT=${OUT:-/tmp/instrument_bench_out}
BUILD=${BUILD:-$ROOT/build-gpu}
DEADLINE=$((T0 + ${DEADLINE_S:-400}))
STORES=/tmp/instrument_bench_stores
mkdir -p "$OUT" "$STORES"
LOG=$OUT/log.txt
log() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$LOG"; }
# stage NAME CMD...: runs CMD, its output in $OUT/NAME.log, and logs its exit code and wall time.
stage() {
  local name=$1 t=$(date +%s) rc
  shift
  log "start $name"
  "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  log "end $name: exit $rc, $(($(date +%s) - t)) s"
  return $rc
}

log "instrument_bench on $(hostname), $(nproc) cores, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  python3 -c "import transformers; print('transformers', transformers.__version__)"
  nvcc --version | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >> "$LOG"

# --- build: rewind._C only (the recording needs no CLI) -------------------------------------
build() {
  local D=$ROOT/.gpu-deps/root
  mkdir -p "$D"
  for f in "$ROOT"/.gpu-deps/*.deb; do dpkg -x "$f" "$D" || return 1; done
  export CMAKE_PREFIX_PATH=$(python3 -c "import torch;print(torch.utils.cmake_prefix_path)"):$D/usr
  export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  local gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  # The configure of scripts/gpu_build.sh, so that a build-gpu it made is reused as it is.
  cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DREWIND_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
    -DREWIND_PYTHON3="$(command -v python3)" \
    -DSQLite3_INCLUDE_DIR="$D/usr/include" \
    -DSQLite3_LIBRARY="$D/usr/lib/x86_64-linux-gnu/libsqlite3.so" || return 1
  cmake --build "$BUILD" --target rewind_python -j "$(nproc)" || return 1
  ls "$BUILD"/python/rewind/_C*.so
}
if [[ ${SKIP_BUILD:-0} == 1 ]]; then log "build skipped (SKIP_BUILD=1): $BUILD as it is"; else stage build build; fi
if ! ls "$BUILD"/python/rewind/_C*.so > /dev/null 2>&1; then
  log "no rewind._C in $BUILD/python/rewind: the benchmark cannot run (build.log's end:)"
  grep -E "error|FAILED|CMake Error" "$OUT/build.log" | head -20 | tee -a "$LOG"
  exit 1
fi
export PYTHONPATH=$BUILD/python
export LD_LIBRARY_PATH=$ROOT/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export CUBLAS_WORKSPACE_CONFIG=:4096:8
python3 -c "import rewind, torch; print('rewind imports; cuda', torch.cuda.is_available())" >> "$LOG" 2>&1

# --- the benchmark: one process a row (a crash loses that row only), each limited to its share
# of the seconds left before the deadline; a part killed at its limit keeps the
# variants it finished (bench.py rewrites its CSV after each).
run_part() {  # run_part NAME SHARE CAP BENCH_ARGS...: SHARE percent of the seconds left, at most CAP
  local name=$1 share=$2 cap=$3 left limit
  shift 3
  left=$((DEADLINE - $(date +%s)))
  limit=$((left * share / 100))
  ((limit > cap)) && limit=$cap
  if ((limit < 20)); then
    log "skip $name: ${left} s left before the deadline"
    return 0
  fi
  log "$name: limit $limit s"
  stage "bench_$name" timeout -k 10 "$limit" python3 "$HERE/bench.py" --device "${BENCH_DEVICE:-cuda}" \
    --steps "${STEPS:-20}" --warmup "${WARMUP:-5}" --store-dir "$STORES" --out "$OUT/part_$name.csv" $INTERLEAVE \
    "$@" ${BENCH_ARGS:-}
  rm -rf "${STORES:?}"/*
}
# The variants' steps in turns (bench.py --interleave) unless INTERLEAVE=0.
INTERLEAVE=$([[ ${INTERLEAVE:-1} == 1 ]] && echo --interleave)
COMPILED=(--variants "${COMPILED_VARIANTS:-plain,plain_det,instrumented,recorded}")
# Compiled rows first: they are what the deadline must not cut.
PARTS=(nanogpt_compiled hf_compiled nanogpt_eager hf_eager hf_compiled_blocks)
ONLY=" ${ONLY:-${PARTS[*]}} "   # ONLY="a b": those parts alone
# part NAME SHARE ...: runs when ONLY names it; the last part ONLY names gets what is left.
part() {
  [[ $ONLY == *" $1 "* ]] || return 0
  local rest=${ONLY#*" $1 "} name=$1 share=$2
  shift 2
  [[ -z ${rest// /} ]] && share=100
  run_part "$name" "$share" "$@"
}
part nanogpt_compiled 50 300 --rows nanogpt:compiled "${COMPILED[@]}"
part hf_compiled 60 300 --rows hf:compiled "${COMPILED[@]}"
part nanogpt_eager 50 90 --rows nanogpt:eager
part hf_eager 100 90 --rows hf:eager
part hf_compiled_blocks 100 300 --rows hf:compiled_blocks "${COMPILED[@]}"

parts=()
for p in "${PARTS[@]}"; do
  [[ -s $OUT/part_$p.csv ]] && parts+=("$OUT/part_$p.csv")
done
if ((${#parts[@]})); then
  stage table python3 "$HERE/bench.py" --table "${parts[@]}" --out "$OUT/results.csv"
  cat "$OUT/results.txt" | tee -a "$LOG"
else
  log "no part wrote a CSV"
fi
rm -rf "$STORES"
log "done"
# The machine hands back a few files only: everything but the table and the log in one archive.
tar -C "$OUT" -czf "$OUT/all.tgz" --exclude all.tgz --exclude results.txt --exclude log.txt . &&
  find "$OUT" -type f ! -name all.tgz ! -name results.txt ! -name log.txt -delete
