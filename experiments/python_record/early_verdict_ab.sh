#!/usr/bin/env bash
# Served `bisect --cmd` probes that end at their verdict, against the same probes run whole
# (REWIND_SCRIPT_STOP=0), in one call: train_gpt.py records 30 steps with L1.H0.qk faulted from
# step 20 (the head's max_logit monitor jumps ~100x there; the loss stays finite, so nothing
# stops a probe but its verdict), then the bisect of window 20:29 with --fail
# 'max(L1.H0.max_logit) > 10' runs ROUNDS times in each mode, alternating, on copies of the
# store (no probe cache). Prints each bisect's wall, probes and the window steps the script ran
# (REWIND_TIMES=probe), and the ratio of the median walls.
# Usage: bash experiments/python_record/early_verdict_ab.sh BUILD OUT   (PYTHON, PRESET=small,
#        DEVICE=cpu, ROUNDS=2, JOBS=1; BUILD must have build/python)
set -euo pipefail
source "$(dirname "$0")/args.sh"
export PYTHONPATH=$BUILD/python CUBLAS_WORKSPACE_CONFIG=:4096:8
CMD="$PY $HERE/train_gpt.py --preset ${PRESET:-small} --device ${DEVICE:-cpu} --attention rewind --steps 30 \
--checkpoint-every 10 --store $OUT/ab.db --plan-from '20:L1.H0.qk=fault(strength=25600)'"
rm -f "$OUT"/ab*.db* "$OUT/early_verdict_ab.txt"
sh -c "$CMD" > "$OUT/ab_record.log"
for round in $(seq "${ROUNDS:-2}"); do
  for mode in stop whole; do
    cp "$OUT/ab.db" "$OUT/ab_$mode.db"
    t0=$(date +%s.%N)
    REWIND_TIMES=probe REWIND_SCRIPT_STOP=$([[ $mode == stop ]] && echo 1 || echo 0) \
      "$BUILD/rewind" bisect --cmd "$CMD" --store "$OUT/ab_$mode.db" --window 20:29 \
      --fail 'max(L1.H0.max_logit) > 10' --jobs "${JOBS:-1}" > "$OUT/ab_$mode.out" 2> "$OUT/ab_$mode.err" || true
    t1=$(date +%s.%N)
    steps=$(grep -o ', [0-9]* steps' "$OUT/ab_$mode.err" | awk '{s += $2} END {print s + 0}')
    printf '%s round %s: wall %.1f s, %s, %s window steps run by the script\n' "$mode" "$round" \
      "$(echo "$t1 - $t0" | bc)" "$(grep -o 'probes: [0-9]* ([^)]*)' "$OUT/ab_$mode.out")" "$steps" \
      | tee -a "$OUT/early_verdict_ab.txt"
    grep '^verdict' "$OUT/ab_$mode.out" | cut -c1-160 >> "$OUT/early_verdict_ab.txt"
  done
done
"$PY" - "$OUT/early_verdict_ab.txt" <<'PY' | tee -a "$OUT/early_verdict_ab.txt"
import re, statistics, sys
walls = {"stop": [], "whole": []}
for line in open(sys.argv[1]):
    m = re.match(r"(stop|whole) round \d+: wall ([\d.]+) s", line)
    if m:
        walls[m.group(1)].append(float(m.group(2)))
s, w = statistics.median(walls["stop"]), statistics.median(walls["whole"])
print(f"median wall: ending at the verdict {s:.1f} s, whole windows {w:.1f} s: {s / w:.2f}x")
PY
