#!/usr/bin/env bash
# The README's first command: build rewind, record a small BF16 run with a hidden fault, verify
# a replay, then let `rewind bisect` find the window in time and the guilty layer/head/op.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_deps
build_rewind

REWIND="$BUILD_DIR/rewind"
WORK="${DEMO_DIR:-$(mktemp -d /tmp/rewind_demo_XXXXXX)}"
mkdir -p "$WORK"
rm -f "$WORK/run.db" "$WORK/run.db-wal" "$WORK/run.db-shm"
# The hidden fault: head 2 of layer 1 rounds its attention output O toward -inf by 64 BF16 ulps
# (the calibrated `o` fault), switched on from step 25. The demo does not tell bisect where.
HIDDEN='L1.H2.o=fault(strength=64)'

echo "== 1. synthetic token data"
"$REWIND" data synth -o "$WORK/data.bin" --tokens 300000 --vocab 64

echo "== 2. record 70 steps (checkpoint every 10) with a fault switched on at step 25"
"$REWIND" train --data "$WORK/data.bin" --steps 70 --vocab-size 64 --checkpoint-every 10 \
  --record "$WORK/run.db" --plan-from "25:$HIDDEN" --log-every 10

echo "== 3. what the store holds"
"$REWIND" store info "$WORK/run.db"

echo "== 4. bit-exact replay of steps 30..39"
"$REWIND" replay --store "$WORK/run.db" --from 30 --to 39 --verify

echo "== 5. bisect: when (checkpoints in time) and where (layer, head, op)"
set +e
"$REWIND" bisect --store "$WORK/run.db" --find-window --fail 'nan || max(loss) > 4.5' \
  --jobs 2 --report "$WORK/report"
code=$?
set -e
echo
echo "== bisect exit code $code (4 = failure localized)"
echo "== the hidden fault was: $HIDDEN from step 25"
echo "== report: $WORK/report/report.html"
echo "== every probe: $REWIND bisect log --store $WORK/run.db"
[[ $code -eq 4 ]]
