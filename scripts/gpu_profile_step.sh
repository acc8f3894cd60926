#!/usr/bin/env bash
# On a GPU: where the time of a gpt2-small training step goes, kernel by kernel, for rewind and
# for the same model in PyTorch (compiled and eager) in the same call. Nsight Compute times each
# kernel alone (one metric: its duration; clocks and caches left alone), so the sums are GPU
# busy time without overlap or host gaps. rewind runs eagerly (REWIND_CUDA_GRAPHS=0: a graph
# runs the same kernels) and its steps are told apart by the fused AdamW launches; PyTorch's
# last STEPS steps are bracketed by cudaProfilerStart/Stop (torch_baseline.py --profile-last).
# Usage: bash scripts/gpu_profile_step.sh [BUILD_DIR] [extra train args]   (after gpu_build.sh)
#        WHO="rewind compile eager" (the default) picks the rows; B, STEPS as below.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-${BUILD:-$ROOT/build-gpu}}
shift || true
OUTDIR=${OUT:-${TMPDIR:-/tmp}}
W=${TMPDIR:-/tmp}/rewind_gpu_profile
rm -rf "$W" && mkdir -p "$W"
STEPS=${STEPS:-3}
B=${B:-8}
NCU=(ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv)
"$BUILD/rewind" data synth --tokens 2000000 --vocab 50304 -o "$W/train.bin" > /dev/null
for who in ${WHO:-rewind compile eager}; do
  if [[ $who == rewind ]]; then
    REWIND_CUDA_GRAPHS=0 "${NCU[@]}" --log-file "$W/ncu_rewind.csv" \
      "$BUILD/rewind" train --preset gpt2-small --device cuda --data "$W/train.bin" --steps $((STEPS + 2)) \
      --batch-size "$B" --gradient-accumulation-steps 1 "$@" > "$W/rewind.log" 2>&1 \
      || { tail -20 "$W/rewind.log"; exit 1; }
  else
    "${NCU[@]}" --profile-from-start off --log-file "$W/ncu_$who.csv" \
      python3 "$ROOT/experiments/train_bench/torch_baseline.py" --data "$W/train.bin" --mode "$who" \
      --steps $((STEPS + 3)) --profile-last "$STEPS" --batch-size "$B" > "$W/$who.log" 2>&1 \
      || { tail -20 "$W/$who.log"; exit 1; }
  fi
  cp "$W/ncu_$who.csv" "$OUTDIR/ncu_step_$who.csv" 2>/dev/null || true
  python3 - "$W/ncu_$who.csv" "$who" "$STEPS" <<'PY'
import csv, sys, collections, re
path, who, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
ki, mi, vi, ui = (head.index(k) for k in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}
seq = [(r[ki], float(r[vi].replace(",", "")) * scale[r[ui]]) for r in rows if r[mi] == "gpu__time_duration.sum"]
if who == "rewind":  # a step ends with its fused AdamW launches; keep the last `steps` whole steps
    ends = [i for i in range(len(seq)) if "adamw_kernel" in seq[i][0] and (i + 1 == len(seq) or "adamw_kernel" not in seq[i + 1][0])]
    if len(ends) < steps + 1:
        sys.exit(f"{who}: found {len(ends)} optimizer steps, need {steps + 1}")
    seq = seq[ends[-steps - 1] + 1:ends[-1] + 1]
def kind(n):
    n = n.lower()
    for k, pat in (("attention", r"flash|fmha|attention|attn|dq_kernel|dkdv|simt_"), ("gemm", r"gemm|nvjet|cutlass|xmma|sm90_|cublas"),
                   ("triton (fused)", r"^triton"), ("layer norm", r"layer_norm|layernorm|ln_forward|ln_backward|ln_dw"), ("cross-entropy", r"cross_entropy|softmax|nll|ce_forward|ce_backward"),
                   ("optimizer, norms", r"adam|multi_tensor|sumsq|finish_kernel|norm|digest"), ("layout copies", r"swap_middle|layout")):
        if re.search(pat, n): return k
    return "elementwise, copies, reductions"
tot, cnt, cat = collections.defaultdict(float), collections.Counter(), collections.defaultdict(float)
for name, ms in seq:
    short = re.sub(r"\s+", " ", name.split("(")[0])[:96]
    tot[short] += ms; cnt[short] += 1; cat[kind(name)] += ms
all_ms = sum(tot.values())
print(f"== {who}: {len(seq) / steps:.0f} launches/step; GPU busy {all_ms / steps:.2f} ms/step (sum of kernel durations, {steps} steps)")
for k, ms in sorted(cat.items(), key=lambda kv: -kv[1]):
    print(f"   {ms / steps:7.3f} ms {100 * ms / all_ms:5.1f}%  {k}")
print(f"{'ms/step':>8} {'share':>6} {'launches':>8}  kernel")
for name, ms in sorted(tot.items(), key=lambda kv: -kv[1])[:int(__import__('os').environ.get('TOP', '25'))]:
    print(f"{ms / steps:8.3f} {100 * ms / all_ms:5.1f}% {cnt[name] / steps:8.1f}  {name}")
PY
done
