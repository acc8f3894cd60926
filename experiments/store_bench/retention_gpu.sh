#!/usr/bin/env bash
# Checkpoint retention on the GPU: gpt2-small (micro-batch 8 x 1024) recorded for STEPS steps
# with a checkpoint every EVERY steps, once keeping every checkpoint and once with `--keep-last K
# --keep-every M`, in the same call. Samples the store's size on disk (store + WAL) every second
# while each runs, and prints the mean and median recorded step of both (what retention adds to a
# step).
# Usage: bash experiments/store_bench/retention_gpu.sh [BUILD_DIR]   (STEPS=250 EVERY=25 K=3 M=100 ACCUM=1)
# A checkpoint that falls due while the previous one is still being written is deferred (the
# recorder's backpressure), so EVERY x the step time should exceed a checkpoint write (~4 s).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
R=$BUILD/rewind
STEPS=${STEPS:-250} EVERY=${EVERY:-25} K=${K:-3} M=${M:-100} ACCUM=${ACCUM:-1}
W=${W:-$(mktemp -d /tmp/rewind_retention_XXXXXX)}
OUT=${OUT:-$W}
mkdir -p "$W" "$OUT"
[[ -f $W/t.bin ]] || "$R" data synth --tokens 5000000 --vocab 50304 -o "$W/t.bin" > /dev/null
size() { { du -bc "$1" "$1-wal" 2>/dev/null || true; } | tail -1 | cut -f1; }
for mode in all kept; do
  db=$W/$mode.db
  rm -f "$db" "$db-wal" "$db-shm"
  extra=(); [[ $mode == kept ]] && extra=(--keep-last "$K" --keep-every "$M")
  "$R" train --preset gpt2-small --device cuda --data "$W/t.bin" --batch-size 8 --gradient-accumulation-steps "$ACCUM" \
    --steps "$STEPS" --checkpoint-every "$EVERY" --log-every 1 --record "$db" "${extra[@]}" > "$OUT/train_$mode.log" 2>&1 &
  pid=$!
  t0=$(date +%s)
  : > "$OUT/size_$mode.txt"
  while kill -0 "$pid" 2>/dev/null; do
    step=$({ grep -E "^step +[0-9]+ " "$OUT/train_$mode.log" || true; } | tail -1 | awk '{print $2}')
    echo "$(( $(date +%s) - t0 )) ${step:--} $(size "$db")" >> "$OUT/size_$mode.txt"
    sleep 1
  done
  wait "$pid" || { echo "train ($mode) failed:"; tail -5 "$OUT/train_$mode.log"; exit 1; }
  echo "$(( $(date +%s) - t0 )) end $(size "$db")" >> "$OUT/size_$mode.txt"
  grep -E "^step +[0-9]+ " "$OUT/train_$mode.log" | awk '$2 + 0 >= 5 && match($0, /\| *[0-9.]+ ms/) {
      v = substr($0, RSTART + 1, RLENGTH - 4); gsub(/ /, "", v); print v}' | sort -g > "$W/ms_$mode.txt"
  awk -v mode="$mode" '{s += $1; a[NR] = $1} END {printf "%s: %d steps, mean recorded step %.2f ms, median %.2f ms\n",
      mode, NR, s / NR, a[int((NR + 1) / 2)]}' "$W/ms_$mode.txt" | tee -a "$OUT/retention.txt"
  "$R" store info "$db" | grep -E "on disk|checkpoints:|stored by kind|free" | tee -a "$OUT/retention.txt"
  echo "$mode: store size (bytes) by second: $(awk '{printf "%s@%s:%.2fG ", $1, $2, $3 / 2^30}' "$OUT/size_$mode.txt")" | tee -a "$OUT/retention.txt"
done
