#!/usr/bin/env bash
# On a GPU: CUDA graphs of the step's passes (train/step_graph.h) against eager steps.
#  1. gpt2-small, micro-batch 8 x 1024, 8 micro-batches a step: REWIND_CUDA_GRAPHS=1 (captured
#     after one eager step) and 0 (eager), ROUNDS rounds taking turns, median of steps 3-12.
#  2. The one-culprit gpt2-small bisect (bisect_bench/gpt2_bisect_bench.sh, mode warm) with
#     the default (REWIND_CUDA_GRAPHS=16: probes of a few steps stay eager) and with 0.
#  3. (part `real`) the real failure's configuration (vocab 256, the paper's qk=sbf16 acc=bf16
#     plan, lr 1e-3): 60 steps recorded (captured at step 16), `replay --from 10 --to 59
#     --verify` across both captures, then 30-step runs with REWIND_CUDA_GRAPHS=1 and 0.
# The step at accumulation 1 against PyTorch: MODE=step bash scripts/gpu_bench.sh BUILD.
# Usage: bash experiments/train_bench/graphs_ab.sh [BUILD_DIR] [PARTS]   (after scripts/gpu_build.sh;
#        PARTS: any of "accum bisect real", default "accum bisect")
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
R=$BUILD/rewind
W=${W:-$(mktemp -d /tmp/rewind_graphs_ab_XXXXXX)}
ROUNDS=${ROUNDS:-2}
PARTS=" ${2:-accum bisect} "
median_of_steps() {  # log, label: the median of the logged steps after the first two
  grep -E "^step +[0-9]" "$1" | awk -F'|' 'NR>2 {gsub(/ ms/,"",$5); print $5+0}' | sort -n |
    awk -v l="$2" '{a[NR]=$1} END {printf "%s: median step %.1f ms over %d steps\n", l, a[int((NR+1)/2)], NR}'
}
"$R" data synth --tokens 20000000 --vocab 50304 -o "$W/t.bin" > /dev/null
[[ $PARTS == *" accum "* ]] && for ((round = 1; round <= ROUNDS; ++round)); do
  for g in 1 0; do
    REWIND_CUDA_GRAPHS=$g "$R" train --preset gpt2-small --device cuda --data "$W/t.bin" --steps 12 --batch-size 8 \
      --gradient-accumulation-steps 8 --log-every 1 > "$W/acc$g.log" 2>&1 || { tail -5 "$W/acc$g.log"; exit 1; }
    median_of_steps "$W/acc$g.log" "accum 8, REWIND_CUDA_GRAPHS=$g, round $round"
  done
done
[[ $PARTS == *" bisect "* ]] && for g in 16 0; do
  REWIND_CUDA_GRAPHS=$g FAULTS='L5.H3.pv=fault(strength=25600)' W="$W/bisect" OUT="$W/bisect_g$g" \
    bash "$ROOT/experiments/bisect_bench/gpt2_bisect_bench.sh" "$BUILD" warm | grep -E "^warm:" | sed "s/^/REWIND_CUDA_GRAPHS=$g: /"
done
if [[ $PARTS == *" real "* ]]; then
  "$R" data synth --tokens 5000000 --vocab 256 -o "$W/t256.bin" > /dev/null
  M=(--preset gpt2-small --device cuda --data "$W/t256.bin" --vocab-size 256 --batch-size 8
     --gradient-accumulation-steps 1 --learning-rate 1e-3 --warmup-iters 2000
     --plan 'L*.H*.qk=sbf16;L*.H*.acc=bf16' --log-every 1)
  "$R" train "${M[@]}" --steps 60 --checkpoint-every 10 --record "$W/real.db" > "$W/real.log" 2>&1
  grep -E "^step +(0|15|16|17|59) " "$W/real.log"
  "$R" replay --store "$W/real.db" --from 10 --to 59 --verify 2>&1 | tail -2
  for ((round = 1; round <= ROUNDS; ++round)); do
    for g in 1 0; do
      REWIND_CUDA_GRAPHS=$g "$R" train "${M[@]}" --steps 30 > "$W/s$g.log" 2>&1
      median_of_steps "$W/s$g.log" "vocab 256, qk=sbf16 acc=bf16, REWIND_CUDA_GRAPHS=$g, round $round"
    done
  done
fi
