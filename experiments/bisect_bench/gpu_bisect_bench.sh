#!/usr/bin/env bash
# A bisect on the GPU against the same bisect on the CPU: record a 6-layer,
# 8-head, D64 model (width 512, seq 64, batch 4, lr 0.01) with a planted pv fault in two heads
# of layer 2 from step 20 that makes the loss climb (4 -> 5.6-7.6 within 8 steps), then
# `rewind bisect --window 20:29 --fail 'nan || max(loss) > T'` on each device, T calibrated on
# that device's own recording: halfway between the highest loss of steps 10-19 (before the
# fault) and the highest of steps 20-29. Prints, per device: T, probes, wall time, the
# recorded step, and the share of probe time spent in FP32 substitutions (per probe: its step
# time x (1 - 1/r), r its measured cost per window step in recorded-plan steps); then the
# CPU/GPU wall-time ratio.
# Usage: bash experiments/bisect_bench/gpu_bisect_bench.sh [BUILD_DIR] [DEVICES] [CPU_THREADS]
#        DEVICES default "cuda cpu"; CPU_THREADS default: all cores (recorded; replay uses it)
#        GPU_COUNTS="1 2 4": the cuda bisect once per count G, G > 1 with --jobs G --gpus 0..G-1
#        (rows cudaxG), on the same recording
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
R=$BUILD/rewind
DEVICES=${2:-cuda cpu}
CPU_THREADS=${3:-$(nproc)}
W=$(mktemp -d /tmp/rewind_gpu_bisect_XXXXXX)
trap 'rm -rf "$W"' EXIT
"$R" data synth -o "$W/d.bin" --tokens 300000 --vocab 64 > /dev/null
FAULT='fault(strength=25600)'
MODEL=(--vocab-size 64 --n-layer 6 --n-head 8 --n-embd 512 --learning-rate 0.01 --steps 30
       --checkpoint-every 10 --plan-from "20:L2.H1.pv=$FAULT;L2.H5.pv=$FAULT")
for dev in $DEVICES; do
  threads=1; [[ $dev == cpu ]] && threads=$CPU_THREADS
  db="$W/$dev.db"
  t0=$(date +%s.%N)
  "$R" train --data "$W/d.bin" "${MODEL[@]}" --device "$dev" --threads "$threads" --record "$db" \
    > "$W/$dev.train" 2>&1 || { tail -5 "$W/$dev.train"; exit 1; }
  tr=$(date +%s.%N)
  T=$(grep -E "^step +[0-9]+ " "$W/$dev.train" | awk '{s = $2 + 0; l = $5 + 0}
        s >= 10 && s < 20 && l > pre {pre = l} s >= 20 && s < 30 && l > post {post = l}
        END {printf "%.2f", (pre + post) / 2}')
  echo "$dev: predicate 'nan || max(loss) > $T'"
  grep -E "^step +(19|2[0-9]) " "$W/$dev.train" | awk '{printf "%s:%s ", $2, $5} END {print ""}' \
    | sed "s/^/$dev recorded loss, steps 19-29: /"
  counts=1; [[ $dev == cuda ]] && counts=${GPU_COUNTS:-1}
  for g in $counts; do
  name=$dev; jobs=()
  if [[ $g != 1 ]]; then name=${dev}x$g; jobs=(--jobs "$g" --gpus "$(seq -s, 0 $((g - 1)))"); fi
  t1=$(date +%s.%N)
  set +e
  "$R" bisect --store "$db" --window 20:29 --fail "nan || max(loss) > $T" --fresh "${jobs[@]}" \
    --report "$W/$name.rep" --quiet > "$W/$name.bisect" 2>&1
  code=$?
  set -e
  t2=$(date +%s.%N)
  python3 - "$W/$name.rep/report.json" "$name" "$threads" "$code" "$t0" "$tr" "$t1" "$t2" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
dev, threads, code = sys.argv[2], sys.argv[3], int(sys.argv[4])
t0, tr, t1, t2 = map(float, sys.argv[5:9])
n = rep.get("narrowing", {})
run = [p for p in rep["probes"] if not p["cached"]]
time = sum(p["step_s"] for p in run)  # the seconds of each probe's window steps
# measured_cost: a probe's step time in recorded-plan steps; per window step:
ratio = {p["index"]: p["measured_cost"] / p["steps"] for p in run if p.get("measured_cost") and p["steps"]}
extra = sum(p["step_s"] * (1 - 1 / ratio[p["index"]]) for p in run if ratio.get(p["index"], 0) > 1)
rec = [p["step_s"] / p["measured_cost"] for p in run if p.get("measured_cost")]
costs = sorted(ratio.values())
print(f"{dev} (threads {threads}): record 30 steps {tr - t0:.1f} s; bisect exit {code}, "
      f"wall {t2 - t1:.1f} s, probes {rep['probes_total']} ({rep['probes_run']} run, "
      f"{rep['probes_cached']} cached; engine {n.get('engine_probes')}), probe steps "
      f"{sum(p['steps'] for p in run)} in {time:.1f} s, recorded-plan step {1e3 * rec[0]:.1f} ms, "
      f"probe step / recorded step min/median/max {costs[0]:.2f}/{costs[len(costs) // 2]:.2f}/{costs[-1]:.2f}, "
      f"FP32 substitutions {100 * extra / time:.1f}% of probe time; fixing set {n.get('fixing_set')}")
print(f"BISECT_WALL {dev} {t2 - t1:.3f}")
PY
  done
done | tee "$W/summary.txt"
awk '$1 == "BISECT_WALL" {w[$2] = $3} END {if (w["cuda"] && w["cpu"]) printf "cpu/cuda bisect wall: %.2fx\n", w["cpu"] / w["cuda"];
     for (g = 2; g <= 8; g *= 2) if (w["cuda"] && w["cudax" g]) printf "%d GPUs / 1 GPU bisect wall: %.2fx\n", g, w["cudax" g] / w["cuda"]}' "$W/summary.txt"
