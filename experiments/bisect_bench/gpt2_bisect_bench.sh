#!/usr/bin/env bash
# Bisect modes at gpt2-small size: record gpt2-small (micro-batch 8 x 1024) for 40 steps with
# a checkpoint every 10 and faults planted in L5.H3.pv (strength 25600) and L5.H3.o (4096) from
# step 20 at lr 0.006, then `rewind bisect --window 20:29 --fail 'nan || max(loss) > T'`, T
# calibrated on the recording: halfway between the highest loss of steps 10-19 and the highest
# of steps 20-29. The same bisect runs once per mode, each with --fresh, on the same store:
#   cold     REWIND_WARM_TRAINER=0 REWIND_WARM_BYTES=0: every probe builds its trainer and reads
#            and decompresses its checkpoint (no warm probes)
#   warm     the default: the warm trainer, its state kept on the GPU (a probe's restore is a
#            device copy)
#   cheap    the default, with --search cheap (the cheaper question first)
#   gpus2, gpus4, cheap2, cheap4   the default (or --search cheap) with --jobs G --gpus 0..G-1:
#            G long-lived workers, one per GPU, each round asking G probes at once
#   groups2  with NPROC=N (the recording on N GPUs, N micro-batches a step): --jobs 2 --gpus
#            0..2N-1, two groups of N ranks; `warm` is then one group of N ranks
# Prints per mode: probes, wall, the probes' step time, overhead per probe (wall minus steps),
# mean probe step cost in recorded steps, predicted vs measured cost, the answer.
# Usage: bash experiments/bisect_bench/gpt2_bisect_bench.sh [BUILD_DIR] [MODES]
#   (PRESET, DEVICE, HEAD and VOCAB stand in for gpt2-small, cuda, L5.H3 and 50304 in a quick
#    check of the script: PRESET=small-cpu DEVICE=cpu HEAD=L2.H1 VOCAB=256; FAULTS replaces the
#    planted plan, e.g. FAULTS='L5.H3.pv=fault(strength=25600)' for one culprit alone)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
MODES=${2:-cold warm cheap}
R=$BUILD/rewind
PRESET=${PRESET:-gpt2-small} DEVICE=${DEVICE:-cuda} HEAD=${HEAD:-L5.H3} VOCAB=${VOCAB:-50304}
FAULTS=${FAULTS:-$HEAD.pv=fault(strength=25600);$HEAD.o=fault(strength=4096)}
NPROC=${NPROC:-1}
W=${W:-$(mktemp -d /tmp/rewind_gpt2_bisect_XXXXXX)}
OUT=${OUT:-$W}
mkdir -p "$W" "$OUT"
[[ -f $W/d.bin ]] || "$R" data synth -o "$W/d.bin" --tokens 2000000 --vocab "$VOCAB" > /dev/null
if [[ ! -f $W/run.db ]]; then
  "$R" train --preset "$PRESET" --device "$DEVICE" --data "$W/d.bin" --vocab-size "$VOCAB" --batch-size 8 \
    --gradient-accumulation-steps "$NPROC" --nproc-per-node "$NPROC" --steps 40 --learning-rate 0.006 --checkpoint-every 10 --log-every 1 \
    --record "$W/run.db" --plan-from "20:$FAULTS" > "$W/train.log" 2>&1 \
    || { tail -5 "$W/train.log"; exit 1; }
fi
T=$(grep -E "^step +[0-9]+ " "$W/train.log" | awk '{s = $2 + 0; l = $5 + 0}
      s >= 10 && s < 20 && l > pre {pre = l} s >= 20 && s < 30 && l > post {post = l}
      END {printf "%.3f", (pre + post) / 2}')
echo "predicate 'nan || max(loss) > $T' (recorded loss, steps 18-29: $(grep -E '^step +(1[89]|2[0-9]) ' "$W/train.log" | awk '{printf "%s ", $5}'))" | tee "$OUT/gpt2_bisect.txt"
for mode in $MODES; do
  env=(); args=()
  case $mode in
    cold) env=(REWIND_WARM_TRAINER=0 REWIND_WARM_BYTES=0) ;;
    warm) ;;
    cheap) args=(--search cheap) ;;
    gpus[0-9]) g=${mode#gpus}; args=(--jobs "$g" --gpus "$(seq -s, 0 $((g - 1)))") ;;
    cheap[0-9]) g=${mode#cheap}; args=(--search cheap --jobs "$g" --gpus "$(seq -s, 0 $((g - 1)))") ;;
    groups[0-9]) g=${mode#groups}; args=(--jobs "$g" --gpus "$(seq -s, 0 $((g * NPROC - 1)))") ;;
    *) echo "unknown mode $mode"; exit 2 ;;
  esac
  t0=$(date +%s.%N)
  set +e
  env "${env[@]}" "$R" bisect --store "$W/run.db" --window 20:29 --fail "nan || max(loss) > $T" --fresh \
    "${args[@]}" --report "$W/$mode.rep" --quiet > "$OUT/bisect_$mode.log" 2>&1
  code=$?
  set -e
  t1=$(date +%s.%N)
  python3 - "$W/$mode.rep/report.json" "$mode" "$code" "$t0" "$t1" <<'PY' | tee -a "$OUT/gpt2_bisect.txt"
import json, sys
rep = json.load(open(sys.argv[1]))
mode, code, t0, t1 = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
n = rep.get("narrowing", {})
run = [p for p in rep["probes"] if not p["cached"]]
steps_s = sum(p["step_s"] for p in run)
wall_p = sum(p["wall_s"] for p in run)
nsteps = sum(p["steps"] for p in run)
cost = [p["measured_cost"] / p["steps"] for p in run if p.get("measured_cost") and p["steps"]]
early = sum(1 for p in run if p.get("stopped_at", -1) >= 0)
c = rep.get("cost", {})
rec = c.get("recorded_step_s") or 0
print(f"{mode}: exit {code}, wall {t1 - t0:.1f} s, probes {len(run)} (early verdicts {early}), "
      f"probe steps {nsteps} in {steps_s:.1f} s, overhead per probe {(wall_p - steps_s) / max(1, len(run)):.2f} s (restore {sum(p.get('restore_s', 0) for p in run) / max(1, len(run)):.2f} s), "
      f"rounds {n.get('batches')}, sum of probe walls {wall_p:.1f} s, "
      f"mean probe step {sum(cost) / max(1, len(cost)):.2f}x the recorded step ({1e3 * rec:.1f} ms), "
      f"cost predicted {c.get('predicted_total')} / calibrated {c.get('calibrated_total')} / measured "
      f"{c.get('measured_total')} recorded steps; failing set {n.get('failing_set')}, fixing set {n.get('fixing_set')}")
sent = [p["sent_s"] for p in run if p.get("sent_s", -1) >= 0]
done = [p["done_s"] for p in run if p.get("done_s", -1) >= 0]
if sent and done:
    print(f"{mode} timeline (s from the probe pool's start; the process ran {t1 - t0:.2f} s): first probe sent "
          f"{min(sent):.2f}, first answer {min(done):.2f}, last answer {max(done):.2f}")
print(f"BISECT_WALL {mode} {t1 - t0:.3f}")
PY
done
awk '$1 == "BISECT_WALL" {w[$2] = $3} END {if (w["cold"] && w["warm"]) printf "warm/cold bisect wall: %.2fx\n", w["warm"] / w["cold"];
     if (w["cold"] && w["cheap"]) printf "cheap/cold bisect wall: %.2fx\n", w["cheap"] / w["cold"];
     for (g = 2; g <= 8; g *= 2) {
       if (w["warm"] && w["gpus" g]) printf "%d GPUs / 1 GPU bisect wall: %.2fx\n", g, w["gpus" g] / w["warm"];
       if (w["cheap"] && w["cheap" g]) printf "%d GPUs / 1 GPU bisect wall, --search cheap: %.2fx\n", g, w["cheap" g] / w["cheap"];
       if (w["warm"] && w["groups" g]) printf "%d groups / 1 group of ranks, bisect wall: %.2fx\n", g, w["groups" g] / w["warm"] }}' \
  "$OUT/gpt2_bisect.txt" | tee -a "$OUT/gpt2_bisect.txt"
