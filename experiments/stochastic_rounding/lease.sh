#!/usr/bin/env bash
# Stochastic rounding on a lent GPU machine in two calls made one right after the other (its
# /tmp does not outlive the lease):
#   bash experiments/stochastic_rounding/lease.sh start 560   # build, start the runs, sr tests and bench
#   bash experiments/stochastic_rounding/lease.sh poll 560    # wait for the runs, copy the results
# `start` builds `rewind`, starts experiments/real_failure/run.sh's FIRST stages (none by default)
# in a session of their own (setsid: they run on between calls), runs device.sh's sr tests,
# `cuda_bench --sr` and the sr record/replay (REST=0: not the rest of the kernel suite) once the
# FIRST stages have left the GPU, and then lets the STAGES start (default `data sr sr-time`:
# the sr runs from step 0, SR_ARMS pv_sr all_sr; the paper's own arm is the failing recording,
# experiments/real_failure/results/hold_h200_*). The stages stop starting anything new
# LEASE seconds (1000) after the first call. Every call waits until SECS into itself or until
# the stages end, then copies what exists under $OUT (one archive, rf.tgz, and the tables as
# files).
# From the recording's checkpoints instead of step 0 (the window's start, 3000, and 1750, a
# checkpoint before the hold verdict's point of no return):
#   FIRST='data record' STEPS=3001 CKPT_WAIT=1 WINDOW='3000 3062' STAGES=sr-window SRW_FROMS=1750 \
#     bash experiments/stochastic_rounding/lease.sh start 560
set -u
T0=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=/tmp/sr_lease; mkdir -p $W/out $W/dev
OUT=${OUT:-$W/copy}; mkdir -p "$OUT"
if [[ ${1:-} == start ]]; then
  [[ -f $W/deadline ]] || echo $((T0 + ${LEASE:-1000})) > $W/deadline
  if [[ ! -x $ROOT/build-gpu/rewind ]]; then
    TARGET=rewind OUT=$W/out/build bash "$ROOT/scripts/gpu_build.sh" > $W/out/build_rewind.txt 2>&1
    echo "build rc $? in $(( $(date +%s) - T0 )) s" >> $W/out/build_rewind.txt
  fi
  if ! pgrep -f "real_failure/run.sh" > /dev/null && [[ ! -f $W/done ]]; then
    # The rest of run.sh's environment (STEPS, EVERY, CKPT_WAIT, WINDOW, SRW_*) passes through.
    RF="bash $ROOT/experiments/real_failure/run.sh"
    setsid env W=$W OUT=$W/out SR_STEPS=${SR_STEPS:-3600} SR_ARMS="${SR_ARMS:-pv_sr all_sr}" DEADLINE=$(cat $W/deadline) \
      bash -c "{ [[ -z '${FIRST:-}' ]] || $RF ${FIRST:-}; } > $W/out/first.txt 2>&1; touch $W/first_done
      while [[ ! -f $W/gpu_free ]]; do sleep 5; done
      $RF ${STAGES:-data sr sr-time} > $W/out/stdout.txt 2>&1; touch $W/done" < /dev/null > /dev/null 2>&1 &
  fi
  [[ -f $W/dev/log.txt ]] || OUT=$W/dev REST=0 DEADLINE_S=${DEV_S:-400} WAIT_FOR=$W/first_done \
    bash "$ROOT/experiments/stochastic_rounding/device.sh" > /dev/null 2>&1
  touch $W/gpu_free
  cp $W/dev/log.txt "$OUT/device_log.txt" 2>/dev/null; cp $W/dev/bench_sr.txt "$OUT/" 2>/dev/null
  cp $W/dev/all.tgz "$OUT/device.tgz" 2>/dev/null
fi
SECS=${2:-560}
while (( $(date +%s) - T0 < SECS )) && [[ ! -f $W/done ]]; do sleep 10; done
tar -C $W/out -czf "$OUT/rf.tgz" --exclude '*.db*' . 2>/dev/null
cp $W/out/sr.txt $W/out/sr_time.txt $W/out/sr_window.txt "$OUT/" 2>/dev/null
echo "deadline in $(( $(cat $W/deadline) - $(date +%s) )) s; done: $([[ -f $W/done ]] && echo yes || echo no)"
tail -12 $W/dev/log.txt 2>/dev/null; tail -8 $W/out/run.log 2>/dev/null
for f in $W/out/sr_*.log $W/out/srw_*.log; do [[ -f $f ]] && { echo "== $f"; tail -2 "$f"; }; done
cat $W/out/sr.txt $W/out/sr_time.txt $W/out/sr_window.txt 2>/dev/null
