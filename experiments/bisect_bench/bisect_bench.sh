#!/usr/bin/env bash
# Probes and wall time that `rewind bisect` spends to localize planted culprits on real replays
# of a small CPU model, against the size of the naive sweep (every layer x head x op, plus one
# MLP per layer). The 12x12x5 case is covered by the synthetic oracle in tests/bisect/search_test.
# Usage: bash experiments/bisect_bench/bisect_bench.sh [BUILD_DIR] [JOBS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
R=${1:-$ROOT/build}/rewind
JOBS=${2:-1}
W=$(mktemp -d /tmp/rewind_bisect_bench_XXXXXX)
trap 'rm -rf "$W"' EXIT
"$R" data synth -o "$W/d.bin" --tokens 300000 --vocab 64 > /dev/null
MODEL="--vocab-size 64 --learning-rate 0.01 --checkpoint-every 20 --steps 40"
FAIL='nan || max(loss) > 3'   # calibrated: clean runs stay <= 2.25 in window 20:39
STRONG='fault(strength=25600)'
case_run() {  # name, planted plan (switched on at step 20)
  local name=$1 plan=$2 db="$W/$1.db"
  "$R" train --data "$W/d.bin" $MODEL --record "$db" --plan-from "20:$plan" > /dev/null
  local t0=$(date +%s.%N)
  set +e
  "$R" bisect --store "$db" --window 20:39 --fail "$FAIL" --jobs "$JOBS" --report "$W/$name" --quiet > "$W/$name.out" 2>&1
  local code=$?
  set -e
  local t1=$(date +%s.%N)
  python3 - "$W/$name/report.json" "$name" "$plan" "$code" "$t0" "$t1" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
name, plan, code, t0, t1 = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
n = rep.get("narrowing", {})
print(f"{name:8s} planted {plan}")
print(f"{'':8s} exit {code}  probes run {rep.get('probes_run')} (total {rep.get('probes_total')}, engine {n.get('engine_probes')})"
      f"  naive sweep {n.get('naive_sweep')}  wall {t1-t0:.1f}s")
print(f"{'':8s} failing set {n.get('failing_set')}  fixing set {n.get('fixing_set')}")
PY
}
echo "model: 2 layers x 4 heads (tiny), window 20:39 (20 steps), --jobs $JOBS"
case_run one   "L1.H2.delta=$STRONG"
case_run two   "L1.H2.delta=$STRONG;L0.H1.delta=$STRONG"
