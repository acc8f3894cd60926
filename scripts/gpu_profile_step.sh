#!/usr/bin/env bash
# On a GPU: where the time of a gpt2-small training step goes, kernel by kernel. Runs STEPS
# steps under Nsight Compute (one metric: kernel duration; clocks left alone) and prints the
# kernels grouped by name, heaviest first, per step. Slow (ncu serializes every launch).
# Usage: bash scripts/gpu_profile_step.sh [BUILD_DIR] [extra train args]   (after gpu_build.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-${BUILD:-$ROOT/build-gpu}}
shift || true
OUTDIR=${OUT:-${TMPDIR:-/tmp}}
W=${TMPDIR:-/tmp}/rewind_gpu_profile
rm -rf "$W" && mkdir -p "$W"
STEPS=${STEPS:-3}
"$BUILD/rewind" data synth --tokens 2000000 --vocab 50304 -o "$W/train.bin" > /dev/null
ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$W/ncu.csv" \
  "$BUILD/rewind" train --preset gpt2-small --device cuda --data "$W/train.bin" --steps "$STEPS" \
  --batch-size "${B:-8}" --gradient-accumulation-steps 1 "$@" > "$W/train.log" 2>&1 \
  || { tail -20 "$W/train.log"; exit 1; }
cp "$W/ncu.csv" "$OUTDIR/ncu_step.csv" 2>/dev/null || true
python3 - "$W/ncu.csv" "$STEPS" <<'PY'
import csv, sys, collections
path, steps = sys.argv[1], int(sys.argv[2])
rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
ki, mi, vi, ui = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value"), head.index("Metric Unit")
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}
tot, cnt = collections.defaultdict(float), collections.Counter()
for r in rows:
    if r[mi] != "gpu__time_duration.sum": continue
    name = r[ki].split("(")[0][:90]
    tot[name] += float(r[vi].replace(",", "")) * scale[r[ui]]
    cnt[name] += 1
all_ms = sum(tot.values())
print(f"{len(rows)} kernel launches in {steps} steps; GPU busy {all_ms / steps:.2f} ms/step")
print(f"{'ms/step':>8} {'share':>6} {'launches/step':>13}  kernel")
for name, ms in sorted(tot.items(), key=lambda kv: -kv[1])[:30]:
    print(f"{ms / steps:8.3f} {100 * ms / all_ms:5.1f}% {cnt[name] / steps:13.1f}  {name}")
PY
