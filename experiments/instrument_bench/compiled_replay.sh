#!/usr/bin/env bash
# The user's compiled loop end to end (compiled_run.py: GPT-2 small, torch.compile, BF16 autocast,
# the model unedited): record STEPS steps with a checkpoint every 10, `rewind replay --cmd
# --verify` from step 12 to 19 (from the checkpoint at 10, bitwise against the recording), then the same run with FAULT planted
# from step 20 through REWIND_PLAN_FROM and `rewind bisect --cmd --window 20:25`, which must name
# FAULT's head and op. Its predicate: 'nan || max(KEY) > X', KEY the loss or the grad norm,
# whichever the fault raises more over steps 20-25, X halfway (log scale) between the two runs'
# highest. Each command's output and wall time land in $OUT.
# Usage: bash experiments/instrument_bench/compiled_replay.sh BUILD OUT
#   BUILD: a build with the rewind CLI and build/python (scripts/gpu_build.sh); RUN_ARGS: more
#   compiled_run.py arguments; REWIND: the CLI (default BUILD/rewind); FAULT
#   (L5.H3.softmax=fault(strength=25600)); STEPS (30). A CPU smoke run: RUN_ARGS='--tiny --device
#   cpu --backend eager' FAULT='L1.H0.softmax=fault(strength=25600)'.
set -euo pipefail
BUILD=$(cd "${1:?BUILD}" && pwd)
OUT=${2:?OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH=$BUILD/python
REWIND=${REWIND:-$BUILD/rewind}
FAULT=${FAULT:-L5.H3.softmax=fault(strength=25600)}
STEPS=${STEPS:-30}
LOG=$OUT/compiled_replay.txt
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
# timed NAME CMD...: runs CMD, its output in $OUT/NAME.log; says its exit code and wall time.
timed() {
  local name=$1 t0 rc
  shift
  t0=$(date +%s.%N)
  set +e
  "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  set -e
  say "$name: exit $rc, $(python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.1f}")' "$t0") s"
  return 0
}
run_cmd() {  # the script command line as `--cmd` takes it (one string, each word quoted)
  printf "'%s' " python3 "$HERE/compiled_run.py" --store "$1" --steps "$STEPS" ${RUN_ARGS:-}
}
rm -f "$OUT"/clean.db* "$OUT"/fault.db*
say "compiled_replay: $(python3 -c 'import torch; print("torch", torch.__version__)'), RUN_ARGS='${RUN_ARGS:-}', FAULT=$FAULT"
timed record_clean bash -c "$(run_cmd "$OUT/clean.db")"
grep "^step" "$OUT/record_clean.log" | tee -a "$LOG" || true
timed replay_verify "$REWIND" replay --cmd "$(run_cmd "$OUT/clean.db")" --store "$OUT/clean.db" --from 12 --to 19 --verify
grep -E "bitwise|differ|error" "$OUT/replay_verify.log" | head -5 | tee -a "$LOG" || true
REWIND_PLAN_FROM="20:$FAULT" timed record_fault bash -c "$(run_cmd "$OUT/fault.db")"
grep "^step" "$OUT/record_fault.log" | tee -a "$LOG" || true
PRED=$(python3 - "$OUT/clean.db" "$OUT/fault.db" <<'PY'
import math, sys
import rewind
def highest(path, key):  # NaN counts as the highest
    s = rewind.open(path).run().steps()
    vals = [v for k, v in zip(s["step"].tolist(), s[key].tolist()) if 20 <= k <= 25]
    return max(vals, key=lambda v: math.inf if math.isnan(v) else v)
best = None
for key in ("loss", "grad_norm"):
    clean, fault = highest(sys.argv[1], key), highest(sys.argv[2], key)
    print(f"highest {key} in 20-25: clean {clean:.4f}, faulted {fault:.4f}", file=sys.stderr)
    ratio = math.inf if math.isnan(fault) else fault / clean
    if best is None or ratio > best[0]:
        best = (ratio, key, clean, fault)
ratio, key, clean, fault = best
if ratio <= 1.05:
    sys.exit("the planted fault raises neither the loss nor the grad norm over steps 20-25")
x = 2 * clean if math.isnan(fault) else math.sqrt(clean * fault)
print(f"nan || max({key}) > {x:.4f}")
PY
) 2>> "$LOG" || { say "no predicate separates the two runs"; exit 1; }
say "predicate: $PRED"
timed bisect "$REWIND" bisect --cmd "$(run_cmd "$OUT/fault.db")" --store "$OUT/fault.db" --window 20:25 --fail "$PRED"
grep -E "failing set|verdict|localized|horizon|checked" "$OUT/bisect.log" | head -12 | tee -a "$LOG" || true
