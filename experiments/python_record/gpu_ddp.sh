#!/usr/bin/env bash
# rewind.record in a data-parallel script on GPUs (torchrun, NCCL, DDP), with train_gpt.py:
#  1. the step time of gpt2-small (batch 8 x 1024 a rank, BF16 autocast, rewind.attention,
#     deterministic) without and with rewind.record (no checkpoint in the timed steps), at each
#     N of NPROCS (1: one plain process; N > 1: torchrun --nproc_per_node N), the two taking
#     turns for ROUNDS rounds, one process (or torchrun) each: medians of the rounds' mean step,
#     their ratio, and the recorder's host time a step on rank 0;
#  2. on 2 ranks, the `small` preset recorded for 30 steps with L1.H0.pv faulted (NaN) from step
#     20: `replay --cmd "torchrun ..." --verify` of steps 12-18, and `bisect --cmd "torchrun ..."`
#     of window 20:25 (the ranks started anew for each probe).
# Usage: bash experiments/python_record/gpu_ddp.sh BUILD OUT   (NPROCS "1 2", ROUNDS 3, STEPS 40, PYTHON;
#        PARTS "1 2" picks the parts; BISECT=0 leaves out part 2's bisect)
set -euo pipefail
source "$(dirname "$0")/args.sh"
export PYTHONPATH=$BUILD/python
export CUBLAS_WORKSPACE_CONFIG=:4096:8
STEPS=${STEPS:-40}
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee "$OUT/gpus.txt"

launch() {  # launch N: the command that starts train_gpt.py on N ranks
  if [[ $1 == 1 ]]; then echo "$PY $HERE/train_gpt.py"; else echo "torchrun --standalone --nproc_per_node $1 $HERE/train_gpt.py"; fi
}
one() {  # one N ARGS...: the JSON line of one run (rank 0's)
  local n=$1
  shift
  timeout 120 $(launch "$n") --preset gpt2-small --device cuda --steps "$STEPS" "$@" 2>> "$OUT/stderr.txt" | grep '^{' | tail -1
}
if [[ " ${PARTS:-1 2} " == *" 1 "* ]]; then
: > "$OUT/steps.jsonl"
for n in ${NPROCS:-1 2}; do
  for ((r = 0; r < ${ROUNDS:-3}; ++r)); do
    rm -f "$OUT"/ddp_bench.db*
    echo "{\"n\": $n, \"variant\": \"plain\", \"run\": $(one "$n" --no-record)}" >> "$OUT/steps.jsonl"
    echo "{\"n\": $n, \"variant\": \"record\", \"run\": $(one "$n" --store "$OUT/ddp_bench.db" --checkpoint-every 100000)}" \
      >> "$OUT/steps.jsonl"
  done
done
rm -f "$OUT"/ddp_bench.db*
"$PY" - "$OUT/steps.jsonl" <<'EOF' | tee "$OUT/step_time.txt"
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("gpt2-small, batch 8 x 1024 a rank, rewind.attention, deterministic; median over rounds of each run's mean step (ms)")
print(f"{'ranks':>5} {'no recorder':>12} {'rewind.record':>14} {'ratio':>7} {'recorder host ms':>17}  rounds (plain / record)")
for n in sorted({r["n"] for r in rows}):
    plain = [r["run"]["mean_step_ms"] for r in rows if r["n"] == n and r["variant"] == "plain"]
    rec = [r["run"]["mean_step_ms"] for r in rows if r["n"] == n and r["variant"] == "record"]
    host = [r["run"]["recorder_host_ms"] for r in rows if r["n"] == n and r["variant"] == "record"]
    p, q = statistics.median(plain), statistics.median(rec)
    print(f"{n:>5} {p:12.2f} {q:14.2f} {q / p:7.3f} {statistics.median(host):17.2f}  "
          f"{' '.join(f'{x:.1f}' for x in plain)} / {' '.join(f'{x:.1f}' for x in rec)}")
EOF
fi
[[ " ${PARTS:-1 2} " == *" 2 "* ]] || exit 0

# 2. Record, replay --verify and bisect through torchrun on 2 ranks.
W=$OUT/small
rm -rf "$W" && mkdir -p "$W" && cd "$W"
T="$(launch 2) --preset small --device cuda --store run.db --steps 30"
source "$HERE/timed.sh"
timed() { timed_run "$W" "$OUT/ddp_check.txt" "$1" timeout 240 "${@:2}"; }  # timed NAME CMD...: output in W/NAME.txt
timed record $T --checkpoint-every 10 --plan-from '20:L1.H0.pv=fault(strength=1e30)'
grep '^{' "$W/record.txt" | tee -a "$OUT/ddp_check.txt"
"$BUILD/rewind" store info run.db | grep -E "steps|checkpoints:" | tee -a "$OUT/ddp_check.txt"
timed replay "$BUILD/rewind" replay --cmd "$T" --store run.db --from 12 --to 18 --verify
tail -2 "$W/replay.txt" | tee -a "$OUT/ddp_check.txt"
[[ ${BISECT:-1} == 1 ]] && timed bisect "$BUILD/rewind" bisect --cmd "$T" --store run.db --window 20:25 --fail nan --quiet
[[ ${BISECT:-1} == 1 ]] && grep -E "^verdict|failing set|fixing set \(|^probes|^script" "$W/bisect.txt" | tee -a "$OUT/ddp_check.txt"
rm -f "$W"/run.db*
