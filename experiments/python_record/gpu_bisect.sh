#!/usr/bin/env bash
# A bisect through the user's script on one GPU: train_gpt.py (gpt2-small) records 30
# steps with a checkpoint every 10 twice, clean and with FAULT (L5.H3.softmax=fault(strength=
# 25600): the head's probabilities other than the row max turn negative; the tiny CPU model's
# loss is NaN from the second step) planted from step 20, then `rewind bisect --cmd` narrows window 20:29 with
# `--fail 'nan || max(KEY) > T'`: of the loss and the grad norm, the one the fault raises most,
# T halfway (log scale) between the two runs' highest in 20-29 (twice the clean run's where the
# fault makes a NaN). A pv fault of the same strength raised gpt2-small's loss by 0.2% at lr 6e-4
# (the tiny CPU model's by 0.06%, at 100x the strength too), less than other ops' rounding
# moves it in 10 steps; at lr 0.006 the loss climbs by itself and decided probes: a wrong
# verdict. Prints the
# verdict, the probes and the wall time; one script process serves the probes. PER_PROBE=1
# then runs the same bisect again (--fresh) with --script-per-probe, a process each, and prints
# the ratio of the walls (the baseline in the same call); GPUS=0,1,.. runs it again (--fresh)
# with --gpus, a serving process on each GPU, and prints that ratio too.
# Usage: bash experiments/python_record/gpu_bisect.sh BUILD OUT   (PYTHON, PRESET, DEVICE, KEEP=1
#        HEAD (L5.H3; L1.H0 for a check on the CPU: PRESET=tiny DEVICE=cpu HEAD=L1.H0 PER_PROBE=1), FAULT
#        as gpu_bench.sh, which runs this as its part 2; BUILD must have build/python)
set -euo pipefail
source "$(dirname "$0")/args.sh"
export PYTHONPATH=$BUILD/python
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS (rewind runs), before CUDA starts
TRAIN=("$PY" "$HERE/train_gpt.py" --preset "${PRESET:-gpt2-small}" --device "${DEVICE:-cuda}" --attention rewind
       --steps 30 --checkpoint-every 10)
rm -rf "$OUT"/bisect.db* "$OUT"/clean.db* "$OUT/bisect_report" "$OUT/bisect.txt"
# The same 30 steps without the fault, for the predicate's threshold: halfway between the
# clean and the faulted run's highest loss in 20-29 (steps 0-19 are the same bits in both).
"${TRAIN[@]}" --store "$OUT/clean.db" > "$OUT/bisect_clean.log"
TRAIN+=(--store "$OUT/bisect.db")
FAULT=${FAULT:-${HEAD:-L5.H3}.softmax=fault(strength=25600)}
"${TRAIN[@]}" --plan-from "20:$FAULT" > "$OUT/bisect_record.log"
echo "planted from step 20: $FAULT" >> "$OUT/bisect.txt"
read -r KEY T <<< "$("$PY" - "$OUT/clean.db" "$OUT/bisect.db" "$OUT/bisect.txt" <<'PY'
import math, sys
import rewind
def top(path, key):
    s = rewind.open(path).run().steps()
    return max((v for k, v in zip(s["step"].tolist(), s[key].tolist()) if 20 <= k < 30),
               key=lambda v: math.inf if math.isnan(v) else v)
found = []
with open(sys.argv[3], "a") as f:
    for key in ("loss", "grad_norm"):
        clean, faulted = top(sys.argv[1], key), top(sys.argv[2], key)
        print(f"highest {key} in 20-29: clean run {clean:.4f}, faulted run {faulted:.4f}", file=f)
        found.append((math.inf if math.isnan(faulted) else faulted / clean, key, clean, faulted))
ratio, key, clean, faulted = max(found)
if math.isnan(faulted):  # 'nan ||' decides; any threshold above the clean run's
    print(key, "%.4f" % (clean * 2))
elif ratio > 1.05:  # halfway on a log scale
    print(key, "%.4f" % math.sqrt(clean * faulted))
else:
    sys.exit("gpu_bisect: the planted fault raises neither the loss nor the grad norm: no predicate separates the runs")
PY
)"
[[ -n "${T:-}" ]] || exit 1
echo "predicate 'nan || max($KEY) > $T'" | tee -a "$OUT/bisect.txt"
# bisect MODE [ARGS]: one bisect --cmd, its output and wall appended to bisect.txt; the wall in $WALL.
bisect() {
  local mode=$1 t0 t1 rc
  shift
  echo "== $mode" >> "$OUT/bisect.txt"
  t0=$(date +%s.%N)
  set +e
  "$BUILD/rewind" bisect --cmd "${TRAIN[*]}" --store "$OUT/bisect.db" --window 20:29 --fail "nan || max($KEY) > $T" \
    --quiet "$@" >> "$OUT/bisect.txt" 2>&1
  rc=$?
  set -e
  t1=$(date +%s.%N)
  WALL=$("$PY" -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$t0" "$t1")
  echo "bisect --cmd ($mode) exit $rc (4: localized), wall $WALL s" >> "$OUT/bisect.txt"
}
bisect "one process serves the probes" --report "$OUT/bisect_report"
served=$WALL
if [[ -n "${GPUS:-}" ]]; then  # GPUS=0,1,2,3: the same bisect with a serving process on each GPU
  bisect "a serving process on each of GPUs $GPUS" --fresh --gpus "$GPUS"
  echo "GPUs $GPUS / one: $("$PY" -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}x")' "$WALL" "$served")" >> "$OUT/bisect.txt"
fi
if [[ "${PER_PROBE:-0}" == 1 ]]; then
  bisect "a process each, --script-per-probe" --fresh --script-per-probe
  echo "served / a process each: $("$PY" -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}x")' "$served" "$WALL")" >> "$OUT/bisect.txt"
fi
cat "$OUT/bisect.txt"
[[ "${KEEP:-0}" == 1 ]] || rm -f "$OUT"/bisect.db* "$OUT"/clean.db*
