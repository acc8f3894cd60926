#!/usr/bin/env bash
# The hold stages on a lent GPU machine held 30 minutes at most, whose /tmp does not outlive it:
#   bash experiments/real_failure/lease.sh start 570   # first call: build, start the stages
#   bash experiments/real_failure/lease.sh poll 585    # calls made at once after it: wait, copy
# `start` builds rewind (scripts/gpu_build.sh, the carried .gpu-deps) and starts
# `run.sh data record hold hold-confirm` in a session of its own (setsid: it runs on between
# calls) with DEADLINE = LEASE seconds (1500) after the first call; every call waits until SECS
# into itself or until the stages end, then copies the results and the store's probes (the
# probe cache, readable even when the bisect was killed) under $OUT.
set -u
T0=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=/tmp/rf; mkdir -p $W/out
if [[ ${1:-} == start ]]; then
  [[ -f $W/deadline ]] || echo $((T0 + ${LEASE:-1500})) > $W/deadline
  [[ -x $ROOT/build-gpu/rewind ]] || { TARGET=rewind OUT=$W/out/build bash "$ROOT/scripts/gpu_build.sh" > $W/out/build.txt 2>&1
                                      echo "build rc $? in $(( $(date +%s) - T0 )) s" >> $W/out/build.txt; }
fi
if ! pgrep -f "real_failure/run.sh" > /dev/null && [[ ! -f $W/done ]]; then
  setsid bash -c "env W=$W OUT=$W/out STEPS=3400 BUDGET=${BUDGET:-13} CKPT_WAIT=${CKPT_WAIT:-} DEADLINE=$(cat $W/deadline) \
    bash $ROOT/experiments/real_failure/run.sh data record hold hold-confirm > $W/out/stdout.txt 2>&1; touch $W/done" \
    < /dev/null > /dev/null 2>&1 &
fi
SECS=${2:-560}
while (( $(date +%s) - T0 < SECS )) && [[ ! -f $W/done ]]; do sleep 10; done
if [[ -f $W/fail.db ]]; then
  python3 - "$W/fail.db" > $W/out/probes.jsonl <<'PY'
import json, sqlite3, sys
c = sqlite3.connect("file:%s?mode=ro" % sys.argv[1], uri=True)
for plan, verdict, metrics, wall, created in c.execute("SELECT plan, verdict, metrics, wall_s, created FROM probes ORDER BY created"):
    print(json.dumps({"plan": plan, "verdict": verdict, "wall_s": wall, "created": created, **json.loads(metrics)}))
PY
fi
cp -r $W/out/. "${OUT:-$W/copy}"/ 2>/dev/null
echo "deadline in $(( $(cat $W/deadline) - $(date +%s) )) s; done: $([[ -f $W/done ]] && echo yes || echo no)"
tail -3 $W/out/build.txt 2>/dev/null; tail -20 $W/out/run.log 2>/dev/null; tail -15 $W/out/hold.txt 2>/dev/null
