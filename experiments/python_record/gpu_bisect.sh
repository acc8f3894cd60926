#!/usr/bin/env bash
# Issue 33's bisect through the user's script on one GPU: train_gpt.py (gpt2-small) records 30
# steps at lr 0.006 with a checkpoint every 10 and L5.H3.pv=fault(strength=25600) planted from
# step 20 (a finite fault: at gpt2-small it raises the loss, it makes no NaN), then
# `rewind bisect --cmd` narrows window 20:29 with `--fail 'nan || max(loss) > T'`, T halfway
# between the highest recorded loss of steps 10-19 and that of steps 20-29 (as
# experiments/bisect_bench/gpt2_bisect_bench.sh does for rewind's own trainer). Prints the
# verdict, the probes and the wall time; one script process serves the probes. PER_PROBE=1
# then runs the same bisect again (--fresh) with --script-per-probe, a process each, and prints
# the ratio of the walls (the baseline in the same call); GPUS=0,1,.. runs it again (--fresh)
# with --gpus, a serving process on each GPU, and prints that ratio too.
# Usage: bash experiments/python_record/gpu_bisect.sh BUILD OUT   (PYTHON, PRESET, DEVICE, KEEP=1
#        and HEAD (L5.H3; L1.H0 for a check on the CPU: PRESET=tiny DEVICE=cpu HEAD=L1.H0 PER_PROBE=1)
#        as gpu_bench.sh, which runs this as its part 2; BUILD must have build/python)
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 BUILD OUT" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=$(cd "$1" && pwd)
mkdir -p "$2"
OUT=$(cd "$2" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH=$BUILD/python
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS (rewind runs), before CUDA starts
TRAIN=("$PY" "$HERE/train_gpt.py" --preset "${PRESET:-gpt2-small}" --device "${DEVICE:-cuda}" --attention rewind
       --store "$OUT/bisect.db" --steps 30 --checkpoint-every 10 --lr 0.006)
rm -rf "$OUT/bisect.db"* "$OUT/bisect_report"
"${TRAIN[@]}" --plan-from "20:${HEAD:-L5.H3}.pv=fault(strength=25600)" > "$OUT/bisect_record.log"
T=$("$PY" - "$OUT/bisect.db" <<'PY'
import sys
import rewind
s = rewind.open(sys.argv[1]).run().steps()
loss = dict(zip(s["step"].tolist(), s["loss"].tolist()))
print("%.4f" % ((max(loss[k] for k in range(10, 20)) + max(loss[k] for k in range(20, 30))) / 2))
PY
)
echo "predicate 'nan || max(loss) > $T'" | tee "$OUT/bisect.txt"
# bisect MODE [ARGS]: one bisect --cmd, its output and wall appended to bisect.txt; the wall in $WALL.
bisect() {
  local mode=$1 t0 t1 rc
  shift
  echo "== $mode" >> "$OUT/bisect.txt"
  t0=$(date +%s.%N)
  set +e
  "$BUILD/rewind" bisect --cmd "${TRAIN[*]}" --store "$OUT/bisect.db" --window 20:29 --fail "nan || max(loss) > $T" \
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
[[ "${KEEP:-0}" == 1 ]] || rm -f "$OUT"/bisect.db*
