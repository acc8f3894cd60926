#!/usr/bin/env bash
# Peak GPU memory of a gpt2-small training step (T=1024, vocab 50304, no
# recording) in rewind and in the same model in plain PyTorch (torch_baseline.py, eager and
# torch.compile), at micro-batches 8..64 on one GPU, and the largest of them each fits; then
# rewind at batch 8 with --record (the recorder's device snapshot of the checkpoint).
# Peaks are the CUDA caching allocator's since the process started (rewind train's
# "peak GPU memory" line; torch.cuda.max_memory_allocated / max_memory_reserved), in GiB,
# shown as allocated/reserved. A run that runs out of device memory is shown as OOM; the
# larger batches of that mode are then not run (shown as "(OOM)").
# Usage: bash experiments/train_bench/memory_bench.sh [BUILD_DIR]   (after scripts/gpu_build.sh)
#        BATCHES="8 32 96" STEPS=5 MODES="rewind eager" bash experiments/train_bench/memory_bench.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-${BUILD:-$ROOT/build-gpu}}
R=$BUILD/rewind
W=${TMPDIR:-/tmp}/rewind_memory_bench
rm -rf "$W" && mkdir -p "$W"
BATCHES=${BATCHES:-8 16 32 48 64}
STEPS=${STEPS:-4}
MODES=${MODES:-rewind eager compile}
LIMIT=${LIMIT:-240}  # seconds per run (a hung run counts as FAIL)
[[ -x "$R" ]] || { echo "memory_bench: no $R (build with scripts/gpu_build.sh first)" >&2; exit 2; }
"$R" data synth --tokens 4000000 --vocab 50304 -o "$W/train.bin" > /dev/null || exit 1

# One run: prints "ALLOC/RESERVED" (GiB), OOM or FAIL; its log is $W/<mode>_b<batch>.log.
measure() {  # mode, batch, extra args
  local mode=$1 b=$2; shift 2
  local log="$W/${mode}_b$b.log" rc line
  if [[ $mode == rewind* ]]; then
    rm -f "$W/rec.db"*
    timeout "$LIMIT" "$R" train --preset gpt2-small --device cuda --data "$W/train.bin" --steps "$STEPS" \
      --batch-size "$b" --gradient-accumulation-steps 1 "$@" > "$log" 2>&1
    rc=$?
    line=$(grep "^peak GPU memory:" "$log" | tail -1 | awk '{printf "%.2f/%.2f", $4, $7}')
  else
    timeout "$LIMIT" python3 "$ROOT/experiments/train_bench/torch_baseline.py" --data "$W/train.bin" --mode "$mode" \
      --steps "$STEPS" --warmup-steps 1 --batch-size "$b" --memory > "$log" 2>&1
    rc=$?
    line=$(grep "^torch-baseline-memory" "$log" | tail -1 | awk '{for (i = 1; i <= NF; ++i) { split($i, kv, "=");
      v[kv[1]] = kv[2] } printf "%.2f/%.2f", v["max_allocated_gib"], v["max_reserved_gib"]}')
  fi
  if grep -qiE "out of (device )?memory|OutOfMemoryError" "$log"; then echo OOM
  elif [[ $rc -ne 0 || -z $line ]]; then echo FAIL
  else echo "$line"; fi
}

declare -A cell largest oomed
for mode in $MODES; do largest[$mode]="none"; oomed[$mode]=0; done
for b in $BATCHES; do
  for mode in $MODES; do
    if [[ ${oomed[$mode]} == 1 ]]; then cell[$mode,$b]="(OOM)"; continue; fi
    t0=$SECONDS
    cell[$mode,$b]=$(measure "$mode" "$b")
    echo "  $mode B=$b: ${cell[$mode,$b]} ($((SECONDS - t0)) s)" >&2
    case ${cell[$mode,$b]} in
      OOM) oomed[$mode]=1 ;;
      FAIL) echo "memory_bench: $mode at batch $b failed:" >&2; tail -5 "$W/${mode}_b$b.log" >&2 ;;
      *) largest[$mode]=$b ;;
    esac
  done
done
rec=""
if [[ " $MODES " == *" rewind "* && ${RECORD:-1} == 1 ]]; then
  rec=$(measure rewind-record 8 --record "$W/rec.db")
  [[ $rec == FAIL ]] && { echo "memory_bench: rewind --record failed:" >&2; tail -5 "$W/rewind-record_b8.log" >&2; }
fi

gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
torch_v=$(python3 -c "import torch; print(torch.__version__)" 2>/dev/null)
echo "peak GPU memory of gpt2-small training (T=1024, vocab 50304, $STEPS steps), GiB allocated/reserved"
echo "(CUDA caching allocator peaks since process start); GPU: ${gpu:-?}; torch ${torch_v:-?}"
printf "%-7s" batch
for mode in $MODES; do
  name=$mode; [[ $mode == compile ]] && name=compiled
  printf " | %-14s" "$name"
done
printf "\n"
for b in $BATCHES; do
  printf "%-7s" "$b"
  for mode in $MODES; do printf " | %-14s" "${cell[$mode,$b]}"; done
  printf "\n"
done
printf "%-7s" largest
for mode in $MODES; do
  fit=${largest[$mode]}; [[ ${oomed[$mode]} == 0 && $fit != none ]] && fit=">= $fit"  # none ran out
  printf " | %-14s" "$fit"
done
printf "   (the largest batch of %s that fit)\n" "${BATCHES// /, }"
if [[ -n $rec ]]; then
  echo "rewind --record at batch 8 (a checkpoint at step 0: its device snapshot included): $rec" \
       "(unrecorded: ${cell[rewind,8]:-not run})"
fi
# The logs beside the other results when OUT is set (the device tool's output folder).
[[ -n "${OUT:-}" ]] && cp "$W"/*.log "$OUT"/ 2>/dev/null
exit 0
