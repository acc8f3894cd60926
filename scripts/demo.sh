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
# The hidden fault: head 2 of layer 1 biases its backward delta = rowsum(dO*O) (the calibrated
# `delta` fault), switched on from step 22. The demo does not tell bisect where or when.
HIDDEN='L1.H2.delta=fault(strength=1e30)'

echo "== 1. synthetic token data"
"$REWIND" data synth -o "$WORK/data.bin" --tokens 300000 --vocab 64

echo "== 2. record 40 steps (lr 0.01, checkpoint every 10) with a fault switched on at step 22"
"$REWIND" train --data "$WORK/data.bin" --steps 40 --vocab-size 64 --learning-rate 0.01 \
  --checkpoint-every 10 --record "$WORK/run.db" --plan-from "22:$HIDDEN" --log-every 5

echo "== 3. what the store holds"
"$REWIND" store info "$WORK/run.db"

echo "== 4. bit-exact replay of steps 20..29"
"$REWIND" replay --store "$WORK/run.db" --from 20 --to 29 --verify

echo "== 5. bisect: when (checkpoints in time) and where (layer, head, op)"
set +e
"$REWIND" bisect --store "$WORK/run.db" --find-window --fail 'nan || spike(loss, 1.4)' \
  --jobs 2 --report "$WORK/report"
code=$?
set -e
echo
echo "== bisect exit code $code (4 = failure localized)"
echo "== the hidden fault was: $HIDDEN from step 22"
echo "== report: $WORK/report/report.html"
echo "== every probe: $REWIND bisect log --store $WORK/run.db"
[[ $code -eq 4 ]]
