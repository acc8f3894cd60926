#!/usr/bin/env bash
# On a GPU: tokens/s of gpt2-small training with rewind's CUDA kernels vs PyTorch SDPA
# attention (same process layout, same run of this script), and the recording overhead.
# Usage: bash scripts/gpu_bench.sh [BUILD_DIR]   (after scripts/gpu_build.sh)
#        MODE=plans bash scripts/gpu_bench.sh    (step time under bisection-probe plans; the FP32
#                                                 plans with 3xTF32 and with simt FP32 GEMMs)
#        MODE=step bash scripts/gpu_bench.sh     (fast block vs module path vs PyTorch, phase times)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-${BUILD:-$ROOT/build-gpu}}
R=$BUILD/rewind
W=${TMPDIR:-/tmp}/rewind_gpu_bench
rm -rf "$W" && mkdir -p "$W"
STEPS=${STEPS:-22}
# The recorded runs are longer: the first two checkpoints allocate the two pinned host buffer
# sets (~1 s each, once per run), which a 22-step run would spread over too few steps. Three
# recorded modes: train's defaults (checkpoint due every 20 steps, taken late while the writer
# is busy; digest every step), the same with --checkpoint-wait (exactly every 20 steps,
# training waits for the writer), and a checkpoint every 100 steps.
RECORD_STEPS=${RECORD_STEPS:-82}
B=${B:-8}
"$R" data synth --tokens 20000000 --vocab 50304 -o "$W/train.bin" > /dev/null
ROUNDS=${ROUNDS:-3}
# Appends the step times (ms) of steps 3.. (warm-up excluded) of one run to $W/<mode>.ms.
run() {  # mode, extra args
  local mode=$1; shift
  local steps=$STEPS; [[ $mode == record* ]] && steps=$RECORD_STEPS
  env ${RUN_ENV:-} "$R" train --preset gpt2-small --device cuda --data "$W/train.bin" --steps "$steps" \
    --batch-size "$B" --gradient-accumulation-steps 1 "$@" > "$W/log.txt" 2>&1 || { cat "$W/log.txt"; exit 1; }
  grep -E "^step +[0-9]" "$W/log.txt" | awk -F'|' 'NR>2 {gsub(/ ms/,"",$5); print $5+0}' >> "$W/$mode.ms"
  cat "$W/log.txt" >> "$W/$mode.log"
  # The last step's loss: a sanity check (all modes train the same model on the same batches).
  grep -E "^step +[0-9]" "$W/log.txt" | tail -1 | awk -F'|' '{sub(/ *loss /,"",$2); print $2+0}' > "$W/$mode.loss"
}
mean() { awk '{s += $1} END {printf "%.1f", s / NR}' "$W/$1.ms"; }
median() { sort -n "$W/$1.ms" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
quartiles() { sort -n "$W/$1.ms" | awk '{a[NR]=$1} END {printf "%.1f-%.1f", a[int(NR/4)+1], a[int(3*NR/4)]}'; }
# One line per mode of the same model in plain PyTorch (experiments/train_bench/torch_baseline.py:
# eager, deterministic, compile) with rewind's speed against it ($ours: rewind's median step).
baseline_rows() {
  local mode line
  for mode in "$@"; do
    line=$(python3 "$ROOT/experiments/train_bench/torch_baseline.py" --data "$W/train.bin" --mode "$mode" \
             --steps "$((STEPS + 8))" --warmup-steps 10 --batch-size "$B" 2>"$W/baseline_$mode.err" | tail -1) \
      || { echo "torch $mode failed:"; tail -5 "$W/baseline_$mode.err"; continue; }
    awk -v l="$line" -v ours="$ours" -v m="$mode" 'BEGIN { n = split(l, f, " "); for (i = 1; i <= n; ++i) { split(f[i], kv, "="); v[kv[1]] = kv[2] }
      printf "%-34s %8.1f %14s %10.0f   rewind speed %.2fx\n", "torch " m, v["median_ms"], v["p25_ms"] "-" v["p75_ms"], v["tokens_per_s"], v["median_ms"] / ours }'
  done
}
# MODE=plans: the step time under bisection-probe plans (default, two pv=fp32 heads, attn=fp32
# in every layer, all=fp32) relative to the default plan, instead of the rows below. The FP32
# plans run twice: with the FP32 linears as 3xTF32 GEMMs (REWIND_FP32_GEMM=3xtf32, opt-in) and
# with cuBLAS's FP32 GEMM (REWIND_FP32_GEMM=simt, the default: train/fp32_gemm.h), each named.
if [[ ${MODE:-} == plans ]]; then
  PLANS=("" "L2.H{1,7}.pv=fp32" "L*.attn=fp32" "all=fp32" "L*.attn=fp32" "all=fp32")  # "": the default plan
  ENVS=("" "" "REWIND_FP32_GEMM=3xtf32" "REWIND_FP32_GEMM=3xtf32" "REWIND_FP32_GEMM=simt" "REWIND_FP32_GEMM=simt")
  for ((round = 0; round < ROUNDS; ++round)); do
    for i in "${!PLANS[@]}"; do RUN_ENV=${ENVS[$i]} run "plan$i" --plan "${PLANS[$i]}"; done
  done
  printf "gpt2-small training, B=%d T=1024, median step (ms) over %d rounds x %d steps\n" "$B" "$ROUNDS" "$((STEPS - 2))"
  printf "%-22s %-8s %10s %14s %10s %10s\n" plan "fp32 gemm" ms "p25-p75 ms" "x default" "last loss"
  for i in "${!PLANS[@]}"; do
    g=${ENVS[$i]#REWIND_FP32_GEMM=}; [[ -z $g ]] && g=default
    awk -v n="${PLANS[$i]:-default}" -v g="$g" -v ms="$(median "plan$i")" -v q="$(quartiles "plan$i")" \
      -v b="$(median plan0)" -v l="$(cat "$W/plan$i.loss")" \
      'BEGIN {printf "%-22s %-8s %10.1f %14s %10.2f %10.4f\n", n, g, ms, q, ms / b, l}'
  done
  # The FP32 plans over the default plan's step, with the default FP32 GEMM
  # (simt: the verdict) and with the opt-in 3xTF32.
  for pair in "2 4 2.0" "3 5 4.0"; do
    read -r split simt target <<< "$pair"
    awk -v n="${PLANS[$split]}" -v a="$(median "plan$split")" -v s="$(median "plan$simt")" -v b="$(median plan0)" \
      -v t="$target" 'BEGIN {r = s / b; printf "%-14s %.2fx the default step (FP32 GEMM simt, the default; target <= %.1fx: %s); %.2fx with 3xtf32 (opt-in)\n",
        n, r, t, r <= t ? "met" : "NOT met", a / b}'
  done
  exit 0
fi
# MODE=record: recording overhead only: unrecorded steps against recorded ones with train's
# defaults (2 compression threads) and with 8 and 1 (RECORD_ONLY=1: the defaults only); means
# over steps 2-81.
if [[ ${MODE:-} == record ]]; then
  for ((round = 0; round < ROUNDS; ++round)); do
    STEPS=$RECORD_STEPS run rewind
    rm -f "$W/rec.db"*; run record --record "$W/rec.db"
    [[ ${RECORD_ONLY:-0} == 1 ]] && continue
    rm -f "$W/rec.db"*; run record-z8 --record "$W/rec.db" --zstd-threads 8
    rm -f "$W/rec.db"*; run record-z1 --record "$W/rec.db" --zstd-threads 1
  done
  printf "gpt2-small, B=%d T=1024, %d rounds x %d steps (steps 2.. timed), checkpoint due every 20\n" "$B" "$ROUNDS" "$RECORD_STEPS"
  printf "%-34s %8s %8s %14s %12s\n" mode "median" "mean" "p25-p75 ms" "mean vs unrec"
  for mode in rewind record record-z8 record-z1; do
    [[ -s $W/$mode.ms ]] || continue
    awk -v n="$mode" -v med="$(median $mode)" -v mn="$(mean $mode)" -v q="$(quartiles $mode)" -v b="$(mean rewind)" \
      'BEGIN {printf "%-34s %8.1f %8.1f %14s %+11.1f%%\n", n, med, mn, q, (mn - b) / b * 100}'
  done
  [[ -n "${OUT:-}" ]] && cp "$W"/record*.log "$OUT"/
  exit 0
fi
# MODE=step: the unrecorded step only: rewind's default (fast blocks, fused loss, LayerNorm
# kernels, CUDA graphs) against no graphs, LibTorch's LayerNorm (REWIND_FUSED_NORM=0), the
# fast blocks with the module path's loss (REWIND_FUSED_LOSS=0), the module path throughout,
# and plain PyTorch (eager, compiled), then phase times.
if [[ ${MODE:-} == step ]]; then
  for ((round = 0; round < ROUNDS; ++round)); do
    # A long run's steady state: the plan captured after one eager step (default: after 16,
    # which a 22-step run would mostly spend eagerly; train/step_graph.h).
    RUN_ENV=REWIND_CUDA_GRAPHS=1 run rewind
    RUN_ENV=REWIND_CUDA_GRAPHS=0 run rewind-no-graphs
    RUN_ENV="REWIND_CUDA_GRAPHS=1 REWIND_FUSED_NORM=0" run rewind-libtorch-norm
    RUN_ENV=REWIND_FUSED_LOSS=0 run rewind-module-loss
    RUN_ENV="REWIND_FAST_BLOCK=0 REWIND_FUSED_LOSS=0" run rewind-module
  done
  ours=$(median rewind)
  printf "gpt2-small training, B=%d T=1024, median step (ms) over %d rounds x %d steps\n" "$B" "$ROUNDS" "$((STEPS - 2))"
  printf "%-34s %8s %14s %10s %10s\n" mode ms "p25-p75 ms" tokens/s "last loss"
  for mode in rewind rewind-no-graphs rewind-libtorch-norm rewind-module-loss rewind-module; do
    awk -v n="$mode" -v ms="$(median $mode)" -v q="$(quartiles $mode)" -v t="$((B * 1024))" -v loss="$(cat "$W/$mode.loss")" \
      'BEGIN {printf "%-34s %8.1f %14s %10.0f %10.4f\n", n, ms, q, t/(ms/1000), loss}'
  done
  # shellcheck disable=SC2086
  baseline_rows ${BASELINES:-eager compile}
  # Phase times synchronize at each edge, so they run without CUDA graphs (step_graph.h).
  for row in "rewind:" "rewind-module-loss:REWIND_FUSED_LOSS=0" "rewind-module:REWIND_FAST_BLOCK=0 REWIND_FUSED_LOSS=0"; do
    IFS=: read -r name envs <<< "$row"
    # shellcheck disable=SC2086
    env $envs REWIND_TIMES=phase "$R" train --preset gpt2-small --device cuda --data "$W/train.bin" --steps 12 \
      --batch-size "$B" --gradient-accumulation-steps 1 2>&1 | grep "^phase times" | sed "s/^/$name: /"
  done
  exit 0
fi
# The modes take turns, ROUNDS times, so a slow phase of the machine hits all of them alike.
for ((round = 0; round < ROUNDS; ++round)); do
  run sdpa --attention sdpa
  run rewind
  RUN_ENV=REWIND_FUSED_OPTIMIZER=0 run rewind-foreach
  run stable --plan 'L*.H*.softmax=stable(beta=2)'
  rm -f "$W/rec.db"*
  run record --record "$W/rec.db"
  rm -f "$W/rec.db"*
  run record-wait --record "$W/rec.db" --checkpoint-wait
  rm -f "$W/rec.db"*
  run record-k100 --record "$W/rec.db" --checkpoint-every 100
done
sdpa=$(median sdpa); ours=$(median rewind); stable=$(median stable)
# The user's own step: the same model in plain PyTorch (experiments/train_bench/torch_baseline.py)
# on the same machine in the same call, eager (SDPA flash, fused AdamW), with
# torch.use_deterministic_algorithms, and torch.compile'd. BASELINE=0 skips it.
if [[ ${BASELINE:-1} == 1 ]]; then
  echo "== PyTorch baseline (experiments/train_bench/torch_baseline.py), rewind's median step $ours ms"
  printf "%-34s %8s %14s %10s\n" baseline ms "p25-p75 ms" tokens/s
  baseline_rows eager deterministic compile
fi
tok=$((B * 1024))
printf "gpt2-small training, B=%d T=1024, median step (ms) over %d rounds x %d steps, tokens/s\n" "$B" "$ROUNDS" "$((STEPS - 2))"
printf "%-26s %8s %14s %10s %8s %10s\n" mode ms "p25-p75 ms" tokens/s ratio "last loss"
for row in "sdpa:$sdpa:sdpa" "rewind:$ours:rewind" "rewind, LibTorch optimizer:$(median rewind-foreach):rewind-foreach" \
           "rewind-stable:$stable:stable" \
           "rewind+record:$(median record):record" "record --checkpoint-wait:$(median record-wait):record-wait" \
           "record K=100:$(median record-k100):record-k100"; do
  IFS=: read -r name ms file <<< "$row"
  awk -v n="$name" -v ms="$ms" -v q="$(quartiles "$file")" -v t="$tok" -v base="$sdpa" \
    -v loss="$(cat "$W/$file.loss")" \
    'BEGIN {printf "%-26s %8.1f %14s %10.0f %8.2f %10.4f\n", n, ms, q, t/(ms/1000), base/ms, loss}'
done
# Checkpoints come every K steps and cost more than the other steps, so the median hides
# them: the mean over all timed steps is what a recorded run takes longer; "steady" leaves out
# the steps up to the second checkpoint (which allocate the pinned buffers). Then where the
# recorded steps' extra time goes (means over the timed steps, ms) and what the checkpoints
# cost each run. Steps are told apart by the number on their line ("steps:" lines are not).
for mode in record record-wait record-k100; do
  echo "== $mode"
  awk -v a="$(median $mode)" -v b="$ours" 'BEGIN {printf "recording overhead: %.1f%% of the median step (%.1f vs %.1f ms)\n", (a-b)/b*100, a, b}'
  awk -v a="$(mean $mode)" -v b="$(mean rewind)" \
    'BEGIN {printf "recording overhead: %.1f%% of the mean step (%.1f vs %.1f ms)\n", (a-b)/b*100, a, b}'
  grep -E "^step +[0-9]" "$W/$mode.log" | awk -F'|' -v b="$(mean rewind)" '
    { split($1, h, " "); pos = h[2] + 0; if (pos < 2) next; n = split($5, w, /[ ,:()]+/);
      for (i = 1; i <= n; ++i) { if (w[i] == "checkpoint") c += w[i+1]; if (w[i] == "digest") d += w[i+1];
                                 if (w[i] == "store") s += w[i+1] } ++m
      if (pos > 20) { t += $5 + 0; ++k } }
    END { printf "recorded steps, mean ms: checkpoint %.1f, digest %.1f, store %.1f\n", c/m, d/m, s/m
          printf "recording overhead, steady (steps after the second checkpoint): %.1f%% (%.1f vs %.1f ms)\n", (t/k-b)/b*100, t/k, b }'
  grep -E "^(checkpoints|steps):" "$W/$mode.log" | sed 's/^/  /'
done
# The recorded runs' logs (every step line), beside the other results when OUT is set.
[[ -n "${OUT:-}" ]] && cp "$W"/record*.log "$OUT"/
# Where a step's time goes (one more short run per mode; the device is synchronized at each
# phase edge, so these steps are a little slower than the timed ones above).
for row in "sdpa:--attention sdpa:" "rewind::" "rewind, LibTorch optimizer::REWIND_FUSED_OPTIMIZER=0" \
           "rewind-stable:--plan L*.H*.softmax=stable(beta=2):"; do
  IFS=: read -r name args envs <<< "$row"
  # shellcheck disable=SC2086
  env $envs REWIND_TIMES=phase "$R" train --preset gpt2-small --device cuda --data "$W/train.bin" --steps 12 \
    --batch-size "$B" --gradient-accumulation-steps 1 $args 2>&1 | grep "^phase times" | sed "s/^/$name: /"
done
