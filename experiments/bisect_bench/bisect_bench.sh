#!/usr/bin/env bash
# Probes `rewind bisect` spends to localize planted culprits: the synthetic 12 x 12 x 5 (+ MLP)
# space for 1, 2 and 6 culprits (bisect_synthetic_bench), then real replays of a small CPU
# model, each with the ddmin engine alone (--search ddmin: delta debugging without group
# testing), group testing (--search groups) and the cheap-direction descent before it (--search
# cheap) in the same run, against the size of the naive sweep (every layer x head x op + MLPs),
# with the engine probes' predicted and measured cost in recorded steps (ENGINES="groups cheap"
# to skip ddmin).
# Usage: bash experiments/bisect_bench/bisect_bench.sh [BUILD_DIR] [JOBS] [PLACEMENTS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
R=$BUILD/rewind
JOBS=${2:-1}
"$BUILD/experiments/bisect_bench/bisect_synthetic_bench" "${3:-40}"
echo
W=$(mktemp -d /tmp/rewind_bisect_bench_XXXXXX)
trap 'rm -rf "$W"' EXIT
"$R" data synth -o "$W/d.bin" --tokens 300000 --vocab 64 > /dev/null
MODEL="--vocab-size 64 --learning-rate 0.01 --checkpoint-every 10"
STRONG='fault(strength=25600)'
case_run() {  # name, train options, bisect options (window and predicate)
  local name=$1 train=$2 how=$3 db="$W/$1.db"
  eval "\"$R\" train --data \"$W/d.bin\" $MODEL --record \"$db\" $train" > /dev/null
  for engine in ${ENGINES:-ddmin groups cheap}; do
    local t0=$(date +%s.%N)
    set +e
    eval "\"$R\" bisect --store \"$db\" $how --search $engine --fresh --jobs $JOBS --report \"$W/$name.$engine\" --quiet" > "$W/$name.out" 2>&1
    local code=$?
    set -e
    local t1=$(date +%s.%N)
    python3 - "$W/$name.$engine/report.json" "$name" "$engine" "$code" "$t0" "$t1" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
name, engine, code, t0, t1 = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
n = rep.get("narrowing", {})
eng = [p for p in rep["probes"] if p["kind"] == "window"]
pred = sum(p["predicted_cost"] or 0 for p in eng)
meas = sum(p["measured_cost"] or 0 for p in eng)
print(f"{name:10s} {engine:6s} exit {code}  window {n.get('window')}  engine probes {n.get('engine_probes')}"
      f"  engine cost predicted {pred:.1f} measured {meas:.1f} recorded steps"
      f" (all probes {rep.get('probes_total')})  naive sweep {n.get('naive_sweep')}  wall {t1-t0:.1f}s"
      f"  failing {n.get('failing_set')}  fixing {n.get('fixing_set')}")
PY
  done
}
echo "real replays: tiny model (2 layers x 4 heads, 3 for 'spike'), --jobs $JOBS"
case_run one   "--steps 40 --plan-from '20:L1.H2.delta=$STRONG'" "--window 20:39 --fail 'nan || max(loss) > 3'"
case_run two   "--steps 40 --plan-from '22:L0.H2.pv=$STRONG' --plan-from '26:L1.H0.delta=$STRONG'" \
               "--window 20:39 --fail 'nan || max(loss) > 3'"
case_run three "--steps 40 --plan-from '20:L0.H1.delta=$STRONG;L0.H3.pv=$STRONG;L1.H2.delta=$STRONG'" \
               "--window 20:39 --fail 'nan || max(loss) > 3'"
case_run spike "--steps 80 --n-layer 3 --plan-from '40:L1.H2.pv=$STRONG'" "--find-window --fail 'spike(loss, 1.4) || nan'"
