#!/usr/bin/env bash
# The user's compiled loop end to end (compiled_run.py: GPT-2 small, torch.compile, BF16 autocast,
# the model unedited): record STEPS steps with a checkpoint every 10, `rewind replay --cmd
# --verify` over steps 12-19 (bitwise against the recording), then the same run with FAULT planted
# from step 20 through REWIND_PLAN_FROM and `rewind bisect --cmd --window 20:25 --fail nan`,
# which must name FAULT's head and op. Each command's output and wall time land in $OUT.
# Usage: bash experiments/instrument_bench/compiled_replay.sh BUILD OUT
#   BUILD: a build with the rewind CLI and build/python (scripts/gpu_build.sh); RUN_ARGS: more
#   compiled_run.py arguments; REWIND: the CLI (default BUILD/rewind) (CPU smoke run: RUN_ARGS='--tiny --device cpu --backend eager'
#   FAULT='L1.H0.pv=fault(strength=1e30)'); FAULT (L5.H3.pv=fault(strength=1e30)); STEPS (30).
set -euo pipefail
BUILD=$(cd "${1:?BUILD}" && pwd)
OUT=${2:?OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH=$BUILD/python
REWIND=${REWIND:-$BUILD/rewind}
FAULT=${FAULT:-L5.H3.pv=fault(strength=1e30)}
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
  say "$name: exit $rc, $(echo "$(date +%s.%N) - $t0" | bc) s"
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
timed bisect "$REWIND" bisect --cmd "$(run_cmd "$OUT/fault.db")" --store "$OUT/fault.db" --window 20:25 --fail nan
grep -E "failing set|verdict|localized|horizon|checked" "$OUT/bisect.log" | head -12 | tee -a "$LOG" || true
