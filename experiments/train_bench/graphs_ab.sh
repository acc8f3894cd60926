#!/usr/bin/env bash
# On a GPU: CUDA graphs of the step's passes (train/step_graph.h) against eager steps.
#  1. gpt2-small, micro-batch 8 x 1024, 8 micro-batches a step: REWIND_CUDA_GRAPHS=1 (captured
#     after one eager step) and 0 (eager), ROUNDS rounds taking turns, median of steps 3-12.
#  2. The one-culprit gpt2-small bisect (bisect_bench/gpt2_bisect_bench.sh, mode warm) with
#     the default (REWIND_CUDA_GRAPHS=16: probes of a few steps stay eager) and with 0.
# The step at accumulation 1 against PyTorch: MODE=step bash scripts/gpu_bench.sh BUILD.
# Usage: bash experiments/train_bench/graphs_ab.sh [BUILD_DIR]   (after scripts/gpu_build.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
R=$BUILD/rewind
W=${W:-$(mktemp -d /tmp/rewind_graphs_ab_XXXXXX)}
ROUNDS=${ROUNDS:-2}
"$R" data synth --tokens 20000000 --vocab 50304 -o "$W/t.bin" > /dev/null
for ((round = 1; round <= ROUNDS; ++round)); do
  for g in 1 0; do
    REWIND_CUDA_GRAPHS=$g "$R" train --preset gpt2-small --device cuda --data "$W/t.bin" --steps 12 --batch-size 8 \
      --gradient-accumulation-steps 8 --log-every 1 > "$W/acc$g.log" 2>&1 || { tail -5 "$W/acc$g.log"; exit 1; }
    grep -E "^step +[0-9]" "$W/acc$g.log" | awk -F'|' 'NR>2 {gsub(/ ms/,"",$5); print $5+0}' | sort -n |
      awk -v g="$g" -v r="$round" '{a[NR]=$1} END {printf "accum 8, REWIND_CUDA_GRAPHS=%s, round %s: median step %.1f ms over %d steps (3-12)\n", g, r, a[int((NR+1)/2)], NR}'
  done
done
for g in 16 0; do
  REWIND_CUDA_GRAPHS=$g FAULTS='L5.H3.pv=fault(strength=25600)' W="$W/bisect" OUT="$W/bisect_g$g" \
    bash "$ROOT/experiments/bisect_bench/gpt2_bisect_bench.sh" "$BUILD" warm | grep -E "^warm:" | sed "s/^/REWIND_CUDA_GRAPHS=$g: /"
done
