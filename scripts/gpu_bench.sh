#!/usr/bin/env bash
# On a GPU: tokens/s of gpt2-small training with rewind's CUDA kernels vs PyTorch SDPA
# attention (same process layout, same run of this script), and the recording overhead.
# Usage: bash scripts/gpu_bench.sh [BUILD_DIR]   (after scripts/gpu_build.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-${BUILD:-$ROOT/build-gpu}}
R=$BUILD/rewind
W=${TMPDIR:-/tmp}/rewind_gpu_bench
rm -rf "$W" && mkdir -p "$W"
STEPS=${STEPS:-12}
B=${B:-8}
"$R" data synth --tokens 20000000 --vocab 50304 -o "$W/train.bin" > /dev/null
run() {  # label, extra args -> median ms of steps 2.. (compile/warm-up excluded)
  "$R" train --preset gpt2-small --device cuda --data "$W/train.bin" --steps "$STEPS" \
    --batch-size "$B" --gradient-accumulation-steps 1 "$@" > "$W/log.txt" 2>&1 || { cat "$W/log.txt"; exit 1; }
  grep -E "^step" "$W/log.txt" | awk -F'|' 'NR>2 {gsub(/ ms/,"",$5); print $5+0}' | sort -n |
    awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
sdpa=$(run --attention sdpa)
ours=$(run)
stable=$(run --plan 'L*.H*.softmax=stable(beta=2)')
rec=$(run --record "$W/rec.db" --checkpoint-every 10 --digest-every 10)
tok=$((B * 1024))
printf "gpt2-small training, B=%d T=1024, median step (ms) and tokens/s\n" "$B"
printf "%-28s %10s %12s %8s\n" mode ms tokens/s ratio
for row in "sdpa:$sdpa" "rewind:$ours" "rewind-stable:$stable" "rewind+record:$rec"; do
  name=${row%%:*}; ms=${row#*:}
  awk -v n="$name" -v ms="$ms" -v t="$tok" -v base="$sdpa" 'BEGIN {printf "%-28s %10.1f %12.0f %8.2f\n", n, ms, t/(ms/1000), base/ms}'
done
awk -v a="$rec" -v b="$ours" 'BEGIN {printf "recording overhead: %.1f%% of step time\n", (a-b)/b*100}'
