#!/usr/bin/env bash
# On a GPU, look for a small configuration where BF16 flash training fails
# while P̄V-in-FP32 and the stabilized softmax do not; bisect the first such failure.
# Each run is recorded (checkpoints every 50) so the failing one can be bisected as is.
# Usage (GPU machine, after scripts/gpu_build.sh): bash experiments/gpu_failure_search/search.sh BUILD OUTDIR
set -uo pipefail
R=$1/rewind
O=$2
mkdir -p "$O"
W=/tmp/rewind_failure_search
rm -rf "$W" && mkdir -p "$W"
# Byte-level text: Python's standard library sources (the only large text on the machine).
find /usr/lib/python3* -name "*.py" 2>/dev/null | sort | head -3000 | xargs cat > "$W/corpus.txt" 2>/dev/null
"$R" data text "$W/corpus.txt" -o "$W/train.bin"
MODEL="--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 16 --vocab-size 256"
STEPS=${STEPS:-600}
PAPER='L*.H*.qk=sbf16;L*.H*.acc=bf16'   # the paper's regime: S and the running O, l in BF16
summary() {  # db -> "first_nan max_loss last_loss"
  python3 - "$1" <<'PY'
import sqlite3, struct, sys, math
c = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
rows = c.execute("select step, loss_bits from steps order by step").fetchall()
loss = [struct.unpack("<f", struct.pack("<I", b & 0xffffffff))[0] for _, b in rows]
nan = next((s for (s, _), l in zip(rows, loss) if not math.isfinite(l)), -1)
fin = [l for l in loss if math.isfinite(l)]
print(nan, f"{max(fin):.3f}" if fin else "nan", f"{loss[-1]:.3f}" if loss else "none", len(loss))
PY
}
printf "%-8s %-34s %10s %9s %9s %6s\n" lr plan first_nan max_loss last_loss steps | tee "$O/search.txt"
found=""
for lr in 3e-3 1e-2 3e-2; do
  for name in standard paper paper+pv32 paper+stable; do
    case $name in
      standard) plan="" ;;
      paper) plan="$PAPER" ;;
      paper+pv32) plan="$PAPER;L*.H*.pv=fp32" ;;
      paper+stable) plan="$PAPER;L*.H*.softmax=stable(beta=2)" ;;
    esac
    db="$W/${name}_${lr}.db"
    timeout 60 "$R" train --device cuda --data "$W/train.bin" $MODEL --steps "$STEPS" --learning-rate "$lr" \
      --warmup-iters 50 --lr-decay-iters "$STEPS" --min-lr 1e-4 --checkpoint-every 50 --digest-every 50 \
      --plan "$plan" --record "$db" --log-every 100 > "$W/${name}_${lr}.log" 2>&1
    read -r nan maxl last n <<< "$(summary "$db")"
    printf "%-8s %-34s %10s %9s %9s %6s\n" "$lr" "$name" "$nan" "$maxl" "$last" "$n" | tee -a "$O/search.txt"
    eval "nan_${name//[+]/_}=$nan"
  done
  # A failure of the paper regime that P̄V-in-FP32 avoids: bisect it (first one only).
  if [[ -z "$found" && "$nan_paper" != "-1" && "$nan_paper_pv32" == "-1" ]]; then
    found="$W/paper_${lr}.db"
    echo "== bisecting $found (lr $lr)" | tee -a "$O/search.txt"
    timeout 240 "$R" bisect --store "$found" --find-window --fail 'nan' --report "$O/report" --quiet \
      2>&1 | tail -25 | tee -a "$O/search.txt"
  fi
done
[[ -z "$found" ]] && echo "no configuration failed in the paper regime while pv=fp32 passed" | tee -a "$O/search.txt"
exit 0
