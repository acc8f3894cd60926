#!/usr/bin/env bash
# Several GPUs of one host, in one call: the multi-GPU tests (dist_cuda_test: record
# on 2 GPUs over NCCL, replay --verify, same batches as one process, kill -9 of a rank, resume),
# then the scaling table: gpt2-small (micro-batch 8 x 1024, 2 micro-batches per GPU a step) on
# N = 1, 2, 4, 8 GPUs (those the machine has), rewind against PyTorch DDP (torchrun,
# experiments/train_bench/torch_baseline.py) with the same global batch, in the same call.
# Usage: bash scripts/gpu_multi.sh   (BUILD, OUT, NS="1 2 4", STEPS=30, SKIP_TESTS=1, TEST_TIMEOUT=200 honoured;
#        QUICK=1: at N = 2 only replay --verify, not step, bisect and the out-of-memory case;
#        PHASES=1: a third run per N > 1 with REWIND_TIMES=phase and one with the gradient
#        exchange after the backward, REWIND_GRAD_BUCKET_MB=0, for the overlap's share;
#        GRAPHS=n: rewind's runs capture their step after n eager steps, default 1; EAGER=1: a
#        run per N without CUDA graphs too; ALT_ENV='VAR=value ...': a run per N > 1 with that
#        environment too, e.g. ALT_ENV=REWIND_GRAPH_BUCKETS=0 for the exchange after the replay)
# Builds rewind and dist_cuda_test with scripts/gpu_build.sh unless $BUILD already has them.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
OUT=${OUT:-$BUILD}
STEPS=${STEPS:-30}
W=${W:-/tmp/rewind_multi}
mkdir -p "$OUT" "$W"
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
NS=${NS:-1 2 4 8}
R=$BUILD/rewind
T=$BUILD/tests/replay/dist_cuda_test
D=$ROOT/.gpu-deps/root
mkdir -p "$D"
for f in "$ROOT"/.gpu-deps/*.deb; do dpkg -x "$f" "$D"; done
export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
if [[ ! -x $R ]]; then TARGET=rewind BUILD=$BUILD OUT=$OUT bash "$ROOT/scripts/gpu_build.sh" || exit 1; fi
if [[ ! -x $T && -z ${SKIP_TESTS:-} ]]; then cmake --build "$BUILD" -j "$(nproc)" --target dist_cuda_test > "$OUT/build_test.log" 2>&1 || tail -20 "$OUT/build_test.log"; fi
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs), $NG GPUs; rewind $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" | tee "$OUT/multi.txt"

if [[ -z ${SKIP_TESTS:-} ]]; then
  echo "== dist_cuda_test" | tee -a "$OUT/multi.txt"
  REWIND_BIN=$R timeout --signal=KILL "${TEST_TIMEOUT:-200}" "$T" 2>&1 | tee "$OUT/dist_cuda_test.log" | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|error" | tee -a "$OUT/multi.txt"
fi

[[ -f $W/t.bin ]] || "$R" data synth --tokens 20000000 --vocab 50304 -o "$W/t.bin" > /dev/null
# The median of the step times printed by rewind ("... | 44.3 ms") or the baseline, skipping the
# first 5 steps (lazy initialization, calibration).
median_ms() { grep -E "^step +[0-9]+ " "$1" | awk '$2 + 0 >= 5 && match($0, /\| *[0-9.]+ ms/) {
                v = substr($0, RSTART + 1, RLENGTH - 4); gsub(/ /, "", v); print v}' | sort -g |
              awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
printf "%-3s %-6s %12s %12s %14s %14s %10s %12s %10s\n" N accum "rewind ms" "DDP ms" "rewind tok/s" "DDP tok/s" "vs DDP" "vs N x 1GPU" "record +" | tee -a "$OUT/multi.txt"
one=""
for n in $NS; do
  (( n <= NG )) || continue
  a=$((2 * n)); tokens=$((a * 8 * 1024))
  common=(--preset gpt2-small --device cuda --data "$W/t.bin" --batch-size 8 --gradient-accumulation-steps "$a"
          --steps "$STEPS" --log-every 1 --nproc-per-node "$n")
  # A long run's steady state: the step captured as a CUDA graph after GRAPHS eager steps
  # (default 1 here; train's default is 16, which a 30-step run would mostly spend eagerly).
  REWIND_CUDA_GRAPHS=${GRAPHS:-1} "$R" train "${common[@]}" > "$OUT/rewind_$n.log" 2>&1 || { echo "rewind on $n GPUs failed:"; tail -5 "$OUT/rewind_$n.log"; }
  if [[ -n ${EAGER:-} ]]; then
    REWIND_CUDA_GRAPHS=0 "$R" train "${common[@]}" > "$OUT/eager_$n.log" 2>&1
    echo "N=$n without CUDA graphs: median step $(median_ms "$OUT/eager_$n.log") ms" | tee -a "$OUT/multi.txt"
  fi
  if [[ -n ${ALT_ENV:-} ]] && (( n > 1 )); then
    env $ALT_ENV REWIND_CUDA_GRAPHS=${GRAPHS:-1} "$R" train "${common[@]}" > "$OUT/alt_$n.log" 2>&1
    echo "N=$n with $ALT_ENV: median step $(median_ms "$OUT/alt_$n.log") ms" | tee -a "$OUT/multi.txt"
  fi
  rm -f "$W/rec_$n.db"*
  REWIND_CUDA_GRAPHS=${GRAPHS:-1} "$R" train "${common[@]}" --record "$W/rec_$n.db" --checkpoint-every 10 > "$OUT/record_$n.log" 2>&1 \
    || { echo "rewind --record on $n GPUs failed:"; tail -5 "$OUT/record_$n.log"; }
  if (( n > 1 )); then  # the recording verifies on its own N without flags
    "$R" replay --store "$W/rec_$n.db" --from 10 --to 19 --verify > "$OUT/replay_$n.log" 2>&1
    echo "replay --verify of the $n-GPU recording, steps 10-19: exit $? ($(grep -o 'bitwise identical[^.]*' "$OUT/replay_$n.log" | head -1))" | tee -a "$OUT/multi.txt"
  fi
  if (( n > 1 )) && [[ -n ${PHASES:-} ]]; then
    REWIND_TIMES=phase "$R" train "${common[@]}" > "$OUT/phases_$n.log" 2>&1
    echo "N=$n $(grep -m1 '^phase times' "$OUT/phases_$n.log")" | tee -a "$OUT/multi.txt"
    REWIND_GRAD_BUCKET_MB=0 "$R" train "${common[@]}" > "$OUT/nobuckets_$n.log" 2>&1
    echo "N=$n exchange after the backward (REWIND_GRAD_BUCKET_MB=0): median step $(median_ms "$OUT/nobuckets_$n.log") ms" | tee -a "$OUT/multi.txt"
  fi
  if [[ $n == 2 && -z ${QUICK:-} ]]; then
    "$R" step --store "$W/rec_$n.db" --step 15 --fp32 'L1.H1.pv' > "$OUT/step_$n.log" 2>&1
    echo "step --store (2-GPU recording) --step 15: exit $? ($(grep -m1 -iE 'loss|error' "$OUT/step_$n.log" | cut -c1-100))" | tee -a "$OUT/multi.txt"
    "$R" bisect --store "$W/rec_$n.db" --window 10:19 --fail 'nan || max(loss) > 100' --quiet > "$OUT/bisect_$n.log" 2>&1
    echo "bisect on the 2-GPU recording's ranks: exit $? ($(grep -m1 '^verdict' "$OUT/bisect_$n.log" | cut -c1-90); $(grep -m1 '^probes' "$OUT/bisect_$n.log"))" | tee -a "$OUT/multi.txt"
    # A rank out of GPU memory: one line naming the rank and what it asked for, no backtrace.
    "$R" train --preset gpt2-small --device cuda --data "$W/t.bin" --batch-size 1024 --gradient-accumulation-steps 2 \
      --steps 2 --nproc-per-node 2 > "$OUT/oom.log" 2>&1
    echo "out of memory on 2 GPUs: exit $?, $(grep -c . "$OUT/oom.log") lines: $(grep -m2 -i 'memory' "$OUT/oom.log" | cut -c1-160 | tr '\n' ' ')" | tee -a "$OUT/multi.txt"
  fi
  torchrun --standalone --nproc-per-node "$n" "$ROOT/experiments/train_bench/torch_baseline.py" --data "$W/t.bin" \
    --accum 2 --steps "$STEPS" --warmup-steps 5 > "$OUT/ddp_$n.log" 2>&1 || { echo "DDP on $n GPUs failed:"; tail -5 "$OUT/ddp_$n.log"; }
  rm=$(median_ms "$OUT/rewind_$n.log"); rec=$(median_ms "$OUT/record_$n.log"); dm=$(median_ms "$OUT/ddp_$n.log")
  [[ -z $one ]] && [[ $n == 1 ]] && one=$rm
  awk -v n="$n" -v a="$a" -v rm="$rm" -v dm="$dm" -v rec="$rec" -v tok="$tokens" -v one="${one:-0}" 'BEGIN {
    rt = tok / (rm / 1e3); dt = tok / (dm / 1e3)
    scale = one > 0 ? sprintf("%.2f", rt / (n * (2 * 8 * 1024) / (one / 1e3))) : "-"
    printf "%-3d %-6d %12.1f %12.1f %14.0f %14.0f %9.2fx %12s %9.1f%%\n", n, a, rm, dm, rt, dt, rt / dt, scale, 100 * (rec / rm - 1) }' \
    | tee -a "$OUT/multi.txt"
done
echo "(medians of steps 5..$((STEPS - 1)); 'vs N x 1GPU': rewind's tokens/s over N times its one-GPU tokens/s; 'record +': the recorded run's median step over the unrecorded one's, checkpoint every 10)" | tee -a "$OUT/multi.txt"
