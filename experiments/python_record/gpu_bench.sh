#!/usr/bin/env bash
# Recording from Python on one GPU, with train_gpt.py (nanoGPT-style, gpt2-small: 12 layers,
# 12 heads, 768, seq 1024, batch 8, BF16 autocast):
#  1. mean step time over STEPS-10 steps (10 warm-up steps left out) of the same loop as
#     (a) SDPA, no recorder, (b) rewind.attention + deterministic algorithms, no recorder,
#     (c) (b) + rewind.record with no checkpoint in the timed steps (the per-step cost),
#     (d) (b) + rewind.record with a checkpoint every 25 steps; ratios c/a, c/b, d/b;
#     (b0) (b) with REWIND_ATTENTION_FP32_PATH=1, rewind.attention's FP32 path (the BF16 path's
#     baseline); and the recorder's host time a step in (c) and (d) (checkpoints included).
#  2. a bisect through `rewind bisect --cmd` of L5.H3.pv=fault planted from step 20 of a
#     30-step recording (gpu_bisect.sh): its verdict, probes and wall time.
#  3. `rewind doctor --cmd` on the SDPA and the rewind.attention variant (2 steps each, twice).
# Usage: bash experiments/python_record/gpu_bench.sh BUILD OUT
#   BUILD: a CUDA build (scripts/gpu_build.sh) with the rewind binary and build/python (the
#          rewind_python target is built here when missing); OUT: where results go.
#   STEPS (60), PYTHON (python3), KEEP=1 keeps the stores (gpt2-small checkpoints: 1.5 GB each),
#   PRESET (gpt2-small; tiny for a smoke run), DEVICE (cuda), ROUNDS (1: more rounds of (a), (b),
#   (b0)), SKIP_DOCTOR=1 (parts 1 and 2 only). (d) runs with REWIND_TIMES=record: each
#   checkpoint's time on the loop's thread, in record_times.txt.
set -euo pipefail
source "$(dirname "$0")/args.sh"
STEPS=${STEPS:-60}
if ! ls "$BUILD"/python/rewind/_C*.so > /dev/null 2>&1; then
  if ! cmake --build "$BUILD" --target rewind_python > "$OUT/build_python.log" 2>&1; then
    tail -20 "$OUT/build_python.log"
    grep -h "rewind Python package" "$BUILD"/CMakeFiles/CMakeOutput.log "$OUT"/configure.log 2>/dev/null | tail -2
    echo "gpu_bench: no rewind Python package in $BUILD (configure says why: python3 with torch, Python.h, pybind11)" >&2
    exit 1
  fi
fi
export PYTHONPATH=$BUILD/python
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS (rewind runs), before CUDA starts
TRAIN=("$PY" "$HERE/train_gpt.py" --preset "${PRESET:-gpt2-small}" --device "${DEVICE:-cuda}")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt" || true

step_ms() {  # mean_step_ms of one run, its JSON line kept in OUT/steps.jsonl
  local line
  line=$("${TRAIN[@]}" --steps "$STEPS" "$@" | tail -1)
  echo "$line" >> "$OUT/steps.jsonl"
  "$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["mean_step_ms"])' "$line"
}
rm -f "$OUT/steps.jsonl" "$OUT"/bench*.db* "$OUT/record_times.txt"
a=$(step_ms --attention sdpa --no-record)
b=$(step_ms --attention rewind --no-record)
c=$(step_ms --attention rewind --store "$OUT/bench_c.db" --checkpoint-every 100000)
d=$(REWIND_TIMES=record step_ms --attention rewind --store "$OUT/bench_d.db" --checkpoint-every 25 2>> "$OUT/record_times.txt")
b0=$(REWIND_ATTENTION_FP32_PATH=1 step_ms --attention rewind --no-record)
# ROUNDS=R: R-1 more rounds of (a), (b), (b0), one process each (processes of one variant differ
# by up to 15%); the ratios below use each variant's mean over the rounds.
mean() { "$PY" -c 'import sys; v = [float(x) for x in sys.argv[1:]]; print(f"{sum(v) / len(v):.2f}")' "$@"; }
as=("$a") bs=("$b") b0s=("$b0")
for ((r = 1; r < ${ROUNDS:-1}; ++r)); do
  as+=("$(step_ms --attention sdpa --no-record)")
  bs+=("$(step_ms --attention rewind --no-record)")
  b0s+=("$(REWIND_ATTENTION_FP32_PATH=1 step_ms --attention rewind --no-record)")
done
echo "rounds: (a) ${as[*]}; (b) ${bs[*]}; (b0) ${b0s[*]}" > "$OUT/rounds.txt"
a=$(mean "${as[@]}") b=$(mean "${bs[@]}") b0=$(mean "${b0s[@]}")
"$PY" - "$a" "$b" "$c" "$d" "$STEPS" "$b0" <<'EOF' | tee "$OUT/step_time.txt"
import sys
a, b, c, d = map(float, sys.argv[1:5])
b0 = float(sys.argv[6])
print(f"gpt2-small, batch 8 x 1024, BF16 autocast, mean of {int(sys.argv[5]) - 10} steps (ms; (a), (b), (b0): means over rounds.txt's processes):")
print(f"  (a) SDPA, no recorder                                   {a:9.2f}")
print(f"  (b) rewind.attention, deterministic, no recorder        {b:9.2f}")
print(f"  (c) (b) + rewind.record, no checkpoint in timed steps   {c:9.2f}")
print(f"  (d) (b) + rewind.record, a checkpoint every 25 steps    {d:9.2f}")
print(f"  (b0) (b) through rewind.attention's FP32 path           {b0:9.2f}")
print(f"ratio c/a (recorded against plain SDPA) {c / a:.3f}; recorder per step c/b {c / b:.3f} "
      f"(target <= 1.03); with checkpoints d/b {d / b:.3f}; attention + determinism b/a {b / a:.3f}; "
      f"BF16 path / FP32 path b/b0 {b / b0:.3f}")
EOF
# The step times above differ by +-15% between processes of one variant (the loop is bound by
# its host); the recorder's own host time a step (rec.batch + rec.step, timed inside run c) not.
"$PY" - "$OUT/steps.jsonl" "$b" <<'EOF' | tee -a "$OUT/step_time.txt"
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
b = float(sys.argv[2])
for name, r in (("(c)", runs[2]), ("(d), checkpoints included", runs[3])):
    print(f"{name} recorder host time a step: {r['recorder_host_ms']:.2f} ms = {100 * r['recorder_host_ms'] / b:.1f}% of (b); "
          f"slowest steps (ms): {r.get('slowest_steps_ms')}")
EOF
cat "$OUT/rounds.txt" "$OUT/record_times.txt" | tee -a "$OUT/step_time.txt"

bash "$HERE/gpu_bisect.sh" "$BUILD" "$OUT"

[[ -n "${SKIP_DOCTOR:-}" ]] && { [[ "${KEEP:-0}" == 1 ]] || rm -f "$OUT"/bench*.db*; exit 0; }
# 3. rewind doctor on the same script: SDPA (backward with atomics, deterministic algorithms
#    off) and rewind.attention (deterministic); the first differing op, or none.
for attn in sdpa rewind; do
  set +e
  t0=$(date +%s.%N)
  "$BUILD/rewind" doctor --cmd "${TRAIN[*]} --attention $attn --store $OUT/doctor.db" > "$OUT/doctor_$attn.txt" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  echo "doctor ($attn) exit $rc (0: no difference, 4: a difference), wall $("$PY" -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$t0" "$t1") s" >> "$OUT/doctor_$attn.txt"
  set -e
  cat "$OUT/doctor_$attn.txt"
done
[[ "${KEEP:-0}" == 1 ]] || rm -f "$OUT"/bench*.db*
