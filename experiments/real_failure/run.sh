#!/usr/bin/env bash
# A gpt2-small run that breaks on its own in the paper's numerics (S rounded to BF16
# before the softmax, running O and l in BF16), recorded, its window found, bisected, explained
# with rewind's monitors, and the fix confirmed by training on past the failure.
#
# Usage (GPU machine, after scripts/gpu_build.sh or with BUILD unbuilt: it builds `rewind`):
#   bash experiments/real_failure/run.sh [stage ...]
# Stages, in order (default: all); each one skips what an earlier call already finished, so a
# call that ran out of time is continued by running the script again on the same machine:
#   data record series size bisect explain confirm widen summary   (and, not in the default list:
#   hold and hold-confirm, the --hold verdict and its independent fork (record with STEPS=3400:
#   the failure and the lasting break are recorded by then, the probes train past it);
#   controls, the same run from step 0 in FA2's numerics and with the stabilized softmax;
#   narrow, sets between layer 1 and layers 0-5 trained on past the failure; sr and sr-time,
#   the paper's numerics with stochastic rounding from step 0 and its step time; sr-window, the
#   same from checkpoints of the recording: record with STEPS past the window's start first)
# The controls, run beside the recording (three 8000-step runs on one GPU, ~80 ms a step each):
#   bash run.sh data; bash run.sh record & bash run.sh controls; wait   (again until both finish)
# Environment: BUILD (build-gpu), W (work dir, /tmp/rewind_real_failure: stores, corpus),
#   OUT (results, $W/out), STEPS (8000: how far the failing run is recorded), EVERY (250:
#   checkpoint spacing), FAIL (the failure predicate), REF (the healthy end of the bisect),
#   DEADLINE (seconds since the epoch after which a stage starts nothing new), CKPT_WAIT (1:
#   record with --checkpoint-wait, a checkpoint at every EVERY steps exactly; unset, a checkpoint
#   the writer has no room for is taken a few steps late, so two recordings differ in their
#   checkpoint steps and the hold verdict, which starts only from checkpoints, with them), HOLD, HFAIL, BUDGET
#   (the hold stage's horizon, predicate and minutes), WINDOW ("FROM TO",
#   the causal window when this machine has no bisect report: "3000 3062"), SR_STEPS, SR_ARMS,
#   SRW_STEPS, SRW_FROMS (the sr stages' length, arms and extra fork points).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
W=${W:-/tmp/rewind_real_failure}
OUT=${OUT:-$W/out}
STEPS=${STEPS:-8000}
EVERY=${EVERY:-250}
PAPER='L*.H*.qk=sbf16;L*.H*.acc=bf16'   # the paper's numerics
REF=${REF:-L*.H*.qk=low;L*.H*.acc=fp32}   # FlashAttention-2's numerics: the control that trains on
FAIL=${FAIL:-grad_norm > 10 * rmedian(grad_norm, 500)}
DEADLINE=${DEADLINE:-0}
HOLD=${HOLD:-3000}      # --hold: how far past the failure a verdict must keep the run healthy
HFAIL=${HFAIL:-rmedian(grad_norm, 50) > 4 * rmedian(grad_norm, 1000)}   # a break that lasts
BUDGET=${BUDGET:-20}    # minutes for the hold search: stop at layers when heads do not fit
R=$BUILD/rewind
PY=${PY:-python3}
A="$PY $ROOT/experiments/real_failure/analyze.py"
mkdir -p "$W" "$OUT"
STAGES=("$@"); [[ ${#STAGES[@]} -eq 0 ]] && STAGES=(data record series size bisect explain confirm widen summary)
log() { echo "== $(date +%T) $*" | tee -a "$OUT/run.log"; }
left() { [[ $DEADLINE == 0 ]] && echo 100000 || echo $((DEADLINE - $(date +%s))); }
MODEL=(--preset gpt2-small --device cuda --data "$W/train.bin" --vocab-size 256 --batch-size 8
       --gradient-accumulation-steps 1 --learning-rate 1e-3 --warmup-iters 2000 --lr-decay-iters 600000
       --min-lr 1e-5 --weight-decay 0 --beta2 0.95 --grad-clip 1.0)

if [[ ! -x $R ]]; then
  log "building rewind"
  TARGET=rewind BUILD=$BUILD OUT=$OUT bash "$ROOT/scripts/gpu_build.sh" || exit 1
fi
D=$ROOT/.gpu-deps/root
export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

# The causal window and the fixing set, as the bisect report says them (empty until known).
# WINDOW="FROM TO" stands in for the report on a machine that has not run the bisect stage.
window() { if [[ -n ${WINDOW:-} ]]; then echo "$WINDOW"
           elif [[ -f $OUT/bisect/report.json ]]; then $A window "$OUT/bisect/report.json"; fi; }
fixing_plan() { [[ -f $OUT/bisect/report.json ]] && $A fixing-plan "$OUT/bisect/report.json" "$REF"; }

# arm NAME PLAN STEPS LOG_EVERY: trains $W/NAME.db from step 0 under PLAN to STEPS in the
# background (checkpoints every 500 steps), resuming where a killed call left it; nothing when
# it is there already. The caller waits.
arm() {
  local name=$1 plan=$2 steps=$3 every=$4 last args
  last=$($A last-step "$W/$name.db" 2>/dev/null || echo -1)
  (( last + 1 < steps )) || return 0
  if [[ -f $W/$name.db ]]; then args=(--resume "$W/$name.db" --steps "$steps")
  else args=("${MODEL[@]}" --steps "$steps" --plan "$plan" --record "$W/$name.db" --checkpoint-every 500); fi
  log "$name to step $steps under '$plan' (from $((last + 1)))"
  timeout --signal=KILL $(( $(left) - 10 )) "$R" train "${args[@]}" --log-every "$every" >> "$OUT/$name.log" 2>&1 &
}
# The stochastic-rounding runs: name|plan (docs/plan.md: what each sr value rounds).
SR_PLANS=("paper|$PAPER" "pv_sr|$PAPER;L*.H*.pv=sr" "all_sr|L*.H*.qk=sr;L*.H*.pv=sr;L*.H*.acc=sr")

for stage in "${STAGES[@]}"; do
  (( $(left) > 30 )) || { log "deadline: stopping before $stage"; exit 0; }
  case $stage in
  data)
    if [[ ! -f $W/train.bin ]]; then
      find /usr/lib/python3* -name "*.py" | sort | head -4000 | xargs cat > "$W/corpus.txt"
      "$R" data text "$W/corpus.txt" -o "$W/train.bin" | tee -a "$OUT/run.log"
    fi
    log "train.bin: $(stat -c %s "$W/train.bin") bytes, md5 $(md5sum < "$W/train.bin" | cut -c1-32)" \
        "(the H100 recording's corpus, results/run.log: 19584982 tokens, md5 890dc03c00dc1d67a959ddd05ef46130)"
    ;;
  record)   # the failing run, resumed where an earlier call stopped (kill -9 keeps the store whole)
    last=$($A last-step "$W/fail.db" 2>/dev/null || echo -1)
    if (( last + 1 < STEPS )); then
      if [[ -f $W/fail.db ]]; then args=(--resume "$W/fail.db" --steps "$STEPS")
      else args=("${MODEL[@]}" --steps "$STEPS" --plan "$PAPER" --record "$W/fail.db" --checkpoint-every "$EVERY" ${CKPT_WAIT:+--checkpoint-wait}); fi
      log "recording the failing run to step $STEPS (from $((last + 1)))"
      timeout --signal=KILL $(( $(left) - 20 )) "$R" train "${args[@]}" --log-every 250 2>&1 | tee -a "$OUT/record.log" | grep -E "^step|error|recorded|resum"
    fi
    log "failing run recorded to step $($A last-step "$W/fail.db")"
    ;;
  controls) # from step 0: FA2's numerics, and the paper's with stable(beta=2), beside the failing
            # run's own recording (all three at once); each resumes where a killed call left it
    for r in "fa2|" "stable|$PAPER;L*.H*.softmax=stable(beta=2)"; do
      arm "control_${r%%|*}" "${r#*|}" "$STEPS" 500
    done
    wait
    for n in fa2 stable; do
      [[ $($A last-step "$W/control_$n.db" 2>/dev/null) == $((STEPS - 1)) ]] || { log "control $n unfinished"; continue 2; }
      $A series "$W/control_$n.db" "$OUT/control_${n}_series.csv" > "$OUT/control_${n}_triggers.txt" || true
    done
    [[ -f $OUT/fail_series.csv ]] || $A series "$W/fail.db" "$OUT/fail_series.csv" > "$OUT/triggers.txt"
    C=("paper numerics (recorded):$OUT/fail_series.csv" "FA2 numerics:$OUT/control_fa2_series.csv"
       "paper numerics + stable(beta=2):$OUT/control_stable_series.csv")
    $A plot "$OUT/controls.svg" "${C[@]}"
    read -r from to <<< "$(window)"
    { $A at 2000,2500,4000,5000,7000,$((STEPS - 1)) "${C[@]}"; echo
      $A confirm "${to:-3062}" "${C[@]}"; } | tee "$OUT/controls.txt"
    $A every 10 "$OUT/controls_every10.csv" "paper:$OUT/fail_series.csv" "fa2:$OUT/control_fa2_series.csv" \
      "stable:$OUT/control_stable_series.csv"
    ;;
  sr)       # from step 0: the paper's numerics, the same with stochastic rounding of P̄ before
            # P̄V (pv=sr), and with every rounding point of the paper's numerics stochastic
            # (qk=sr, pv=sr, acc=sr); SR_STEPS steps each, all at once on one GPU, each resumed
            # where a killed call left it. The rounding points: docs/plan.md, docs/design.md.
    # SR_ARMS: which (paper, pv_sr, all_sr); the paper's arm is the failing recording's run.
    SR_STEPS=${SR_STEPS:-4000}
    for r in "${SR_PLANS[@]}"; do
      [[ " ${SR_ARMS:-paper pv_sr all_sr} " == *" ${r%%|*} "* ]] || continue
      arm "sr_${r%%|*}" "${r#*|}" "$SR_STEPS" 250
    done
    wait
    C=(); rm -f "$OUT/sr_last.txt"
    for n in paper pv_sr all_sr; do
      last=$($A last-step "$W/sr_$n.db" 2>/dev/null) || continue
      $A series "$W/sr_$n.db" "$OUT/sr_${n}_series.csv" > "$OUT/sr_${n}_triggers.txt" || continue
      C+=("$n:$OUT/sr_${n}_series.csv")
      echo "$n: recorded to step $last" >> "$OUT/sr_last.txt"
    done
    ((${#C[@]})) || { log "no sr run recorded a step"; continue; }
    { cat "$OUT/sr_last.txt"; $A at 1000,2000,3000,3400,3800,$((SR_STEPS - 1)) "${C[@]}"; echo
      for n in paper pv_sr all_sr; do echo "== $n"; cat "$OUT/sr_${n}_triggers.txt" 2>/dev/null; done; } | tee "$OUT/sr.txt"
    $A every 10 "$OUT/sr_every10.csv" "${C[@]}"
    ;;
  sr-window) # the same sr plans from checkpoints of the failing recording instead of step 0: the
            # causal window's start and SRW_FROMS (e.g. a checkpoint before the hold verdict's
            # point of no return), each to SRW_STEPS; the paper's numerics from the window's
            # start as the control (it must break where the recording broke). All at once on one GPU.
    read -r wfrom _ <<< "$(window)"
    [[ -n ${wfrom:-} ]] || { log "sr-window: no window yet"; continue; }
    SRW_STEPS=${SRW_STEPS:-4400}
    [[ -f $OUT/fail_series.csv ]] || $A series "$W/fail.db" "$OUT/fail_series.csv" > "$OUT/triggers.txt"
    runs=()
    for from in $wfrom ${SRW_FROMS:-}; do
      for r in "${SR_PLANS[@]}"; do
        [[ ${r%%|*} == paper && $from != "$wfrom" ]] && continue
        runs+=("srw_${r%%|*}_$from|$from|${r#*|}")
      done
    done
    for r in "${runs[@]}"; do
      IFS='|' read -r name from plan <<< "$r"
      [[ $($A last-step "$W/$name.db" 2>/dev/null) == $((SRW_STEPS - 1)) ]] && continue
      rm -f "$W/$name.db" "$W/$name.db-wal" "$W/$name.db-shm"   # a branch cut short starts again
      log "fork at $from under '$plan' to step $SRW_STEPS ($name)"
      timeout --signal=KILL $(( $(left) - 10 )) "$R" train --fork "$W/fail.db" --at "$from" --plan "$plan" \
        --record "$W/$name.db" --steps "$SRW_STEPS" --checkpoint-every 100000 --log-every 500 > "$OUT/$name.log" 2>&1 &
    done
    wait
    C=()
    for r in "${runs[@]}"; do
      name=${r%%|*}
      $A series "$W/$name.db" "$OUT/${name}_series.csv" > "$OUT/${name}_triggers.txt" && C+=("$name:$OUT/${name}_series.csv")
    done
    ((${#C[@]})) || { log "no sr-window branch recorded a step"; continue; }
    $A lasting --history "$OUT/fail_series.csv" "${C[@]}" | tee "$OUT/sr_window.txt"
    $A every 10 "$OUT/sr_window_every10.csv" "${C[@]}"
    ;;
  sr-time)  # the step time of each sr plan alone on the GPU, 300 steps unrecorded, against the
            # paper's numerics in the same call
    for r in "${SR_PLANS[@]}"; do
      log "step time ${r%%|*}"
      timeout --signal=KILL $(( $(left) - 10 )) "$R" train "${MODEL[@]}" --steps 300 --plan "${r#*|}" \
        --log-every 100 2>&1 | tail -4 | sed "s/^/${r%%|*}: /" | tee -a "$OUT/sr_time.txt"
    done
    ;;
  series)   # every step's loss and gradient norm; where each candidate predicate first fires
    $A series "$W/fail.db" "$OUT/fail_series.csv" | tee "$OUT/triggers.txt"
    ;;
  size)     # the store's size on disk: file bytes (after the WAL is folded in), bytes by kind
    { du -b "$W"/fail.db*; "$R" store info "$W/fail.db"; } 2>&1 | tee "$OUT/store_size.txt"
    ;;
  bisect)   # the causal window (time search under the reference), then layers, heads, ops
    log "bisect --find-window --fail '$FAIL' --reference '$REF'"
    timeout --signal=KILL $(( $(left) - 10 )) "$R" bisect --store "$W/fail.db" --find-window --fail "$FAIL" \
      --reference "$REF" --report "$OUT/bisect" --quiet 2>&1 | tee "$OUT/bisect.txt"
    ;;
  hold)     # the verdict that holds: the point of no return and the durable set for HOLD steps
            # past the failure (HFAIL: a lasting break, not a single spike), in the budget; the
            # leading indicator's agreement measured on every narrowing probe (it stops none)
    log "bisect --find-window --hold $HOLD --fail '$HFAIL' --reference '$REF' --budget $BUDGET"
    timeout --signal=KILL $(( $(left) - 10 )) "$R" bisect --store "$W/fail.db" --find-window --hold "$HOLD" \
      --fail "$HFAIL" --reference "$REF" --granularity heads --budget "$BUDGET" --early-band 2 --report "$OUT/hold" --quiet \
      2>&1 | tee "$OUT/hold.txt"
    ;;
  hold-confirm)  # the hold verdict's fork, trained independently, replayed bit for bit, and
                 # compared with the reference branch of the same bisect
    cmdline=$($A hold-fork "$OUT/hold/report.json" "$W/fail.db" "$W/hold_fork.db") || { log "no fork command"; continue; }
    rm -f "$W/hold_fork.db" "$W/hold_fork.db-wal" "$W/hold_fork.db-shm"
    log "confirm: $cmdline"
    eval "timeout --signal=KILL $(( $(left) - 10 )) $R ${cmdline#rewind } --log-every 500" > "$OUT/hold_fork.log" 2>&1
    from=$($A hold-field "$OUT/hold/report.json" from)
    "$R" replay --store "$W/hold_fork.db" --from "$from" --to $((from + 200)) --verify 2>&1 | tail -2 | tee "$OUT/hold_verify.txt"
    $A series "$W/hold_fork.db" "$OUT/hold_fork_series.csv" > /dev/null
    $A hold-compare "$OUT/hold/report.json" "$OUT/hold_fork_series.csv" | tee "$OUT/hold_compare.txt"
    ;;
  explain)  # per-head monitors over the run; one step inside the window, fixing set vs recorded
    read -r from to <<< "$(window)"
    [[ -n ${from:-} ]] || { log "explain: no window yet"; continue; }
    fix=$(fixing_plan)
    $A monitors "$W/fail.db" "$OUT/bisect/report.json" "$OUT/monitors.csv" "$OUT/monitors.svg" | tee "$OUT/explain.txt"
    s=$(( (from + to) / 2 ))
    log "rewind step at $s with the fixing set at the reference: $fix"
    "$R" step --store "$W/fail.db" --step "$s" --fp32 "$fix" --json "$OUT/step.json" 2>&1 | tail -40 | tee -a "$OUT/explain.txt"
    ;;
  confirm|widen|narrow)
    # confirm: from the window's start, the bisect's fixing set at the reference, and every
    # head at it (FA2 numerics), each trained 3000 steps past the failure step. widen: larger
    # sets, for when the fixing set does not hold that long (the smallest that does).
    read -r from to <<< "$(window)"
    [[ -n ${from:-} ]] || { log "$stage: no window yet"; continue; }
    until=$(( to + 3000 ))
    if [[ $stage != widen ]]; then
      runs=("fixset|$(fixing_plan)" "reference|$REF")
    else
      # The failing set's heads, their layer, then halves of the model (their qk and acc at the
      # reference), and the stabilized softmax in the fixing set's head.
      rp=$OUT/bisect/report.json
      runs=("heads|$($A set-plan "$rp" "$REF" failing)" "layer|$($A set-plan "$rp" "$REF" layers)"
            "stable|$($A set-plan "$rp" "$REF" stable)" "l0_2|L{0-2}.H*.qk=low;L{0-2}.H*.acc=fp32"
            "l0_5|L{0-5}.H*.qk=low;L{0-5}.H*.acc=fp32" "l1_6_11|L{1,6-11}.H*.qk=low;L{1,6-11}.H*.acc=fp32")
    fi
    if [[ $stage == narrow ]]; then   # between L1 (does not hold) and L0-5 (holds)
      runs=("l1_2|L{1-2}.H*.qk=low;L{1-2}.H*.acc=fp32" "l1_3|L{1-3}.H*.qk=low;L{1-3}.H*.acc=fp32"
            "l1_5|L{1-5}.H*.qk=low;L{1-5}.H*.acc=fp32")
    fi
    for r in "${runs[@]}"; do   # three at a time on one GPU: ~75 ms a step each on the H100
      name=${r%%|*}; plan=${r#*|}
      [[ $($A last-step "$W/$name.db" 2>/dev/null) == $((until - 1)) ]] && continue
      rm -f "$W/$name.db" "$W/$name.db-wal" "$W/$name.db-shm"   # a branch cut short starts again
      log "fork at $from under '$plan' to step $until ($name)"
      timeout --signal=KILL $(( $(left) - 10 )) "$R" train --fork "$W/fail.db" --at "$from" --plan "$plan" \
        --record "$W/$name.db" --steps "$until" --checkpoint-every 100000 --log-every 500 > "$OUT/confirm_$name.log" 2>&1 &
      (( $(jobs -r | wc -l) >= 3 )) && wait -n
    done
    wait
    for r in "${runs[@]}"; do name=${r%%|*}; $A series "$W/$name.db" "$OUT/${name}_series.csv" > "$OUT/${name}_triggers.txt" || true; done
    ;;
  summary)
    read -r from to <<< "$(window)"
    S=$OUT
    $A confirm "$to" "paper numerics, recorded (0..$((STEPS - 1))):$S/fail_series.csv" \
      "L1.H2 qk+acc (the bisect's fixing set):$S/fixset_series.csv" "L1.H2 stable(beta=2):$S/stable_series.csv" \
      "L1.H{0,2,3} qk+acc (failing set):$S/heads_series.csv" "L1 qk+acc (12 heads):$S/layer_series.csv" \
      "L1-2 qk+acc (24 heads):$S/l1_2_series.csv" "L1-3 qk+acc (36 heads):$S/l1_3_series.csv" \
      "L1-5 qk+acc (60 heads):$S/l1_5_series.csv" \
      "L0-2 qk+acc (36 heads):$S/l0_2_series.csv" "L1, L6-11 qk+acc (84 heads):$S/l1_6_11_series.csv" \
      "L0-5 qk+acc (72 heads):$S/l0_5_series.csv" "every head qk+acc (FA2 numerics):$S/reference_series.csv" | tee "$OUT/confirm.txt"
    # The same, with the recorded steps before the fork as the trailing median's history, so a
    # branch's first 500 steps are judged too (the table above starts judging 500 steps in).
    $A confirm "$to" --history "$S/fail_series.csv" "L1.H2 qk+acc:$S/fixset_series.csv" "L1 qk+acc:$S/layer_series.csv" \
      "L1-2 qk+acc:$S/l1_2_series.csv" "L1-3 qk+acc:$S/l1_3_series.csv" "L1-5 qk+acc:$S/l1_5_series.csv" \
      "L0-5 qk+acc:$S/l0_5_series.csv" "every head qk+acc:$S/reference_series.csv" | tee "$OUT/confirm_history.txt"
    $A plot "$OUT/narrow.svg" "paper numerics (recorded):$S/fail_series.csv" "from $from, FA2 numerics in L1-2:$S/l1_2_series.csv" \
      "from $from, in L1-3:$S/l1_3_series.csv" "from $from, in L1-5:$S/l1_5_series.csv"
    $A every 10 "$OUT/narrow_every10.csv" "l1_2:$S/l1_2_series.csv" "l1_3:$S/l1_3_series.csv" "l1_5:$S/l1_5_series.csv"
    $A plot "$OUT/curves.svg" "paper numerics (recorded):$S/fail_series.csv" \
      "from $from, FA2 numerics in every head:$S/reference_series.csv" "from $from, fixing set L1.H2:$S/fixset_series.csv" \
      "from $from, FA2 numerics in L0-5:$S/l0_5_series.csv"
    $A plot "$OUT/fixes.svg" "L1.H2 (bisect's fixing set):$S/fixset_series.csv" "L1.H2 stable(beta=2):$S/stable_series.csv" \
      "L1.H{0,2,3} (failing set):$S/heads_series.csv" "L1 (12 heads):$S/layer_series.csv" "L0-2:$S/l0_2_series.csv" \
      "L1, L6-11:$S/l1_6_11_series.csv" "L0-5:$S/l0_5_series.csv" "every head:$S/reference_series.csv"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
