#!/usr/bin/env bash
# The "Debug your own training loop" diff of docs/nanogpt.md on nanoGPT's own model.py and
# train.py (a checkout of karpathy/nanoGPT), end to end on the CPU: nanogpt_diff.py applies the
# diff as written (an error names the line that no longer matches), then train.py, at a tiny
# size on synthetic tokens (2 layers, 2 heads, width 64, 4 x 64 tokens, 2 micro-steps), records
# 30 iterations with a fault planted in L1.H0's P̄V from iteration 20 (the one line this check
# adds: plan_from), `rewind replay --cmd --verify` replays iterations 12-18 bitwise, `rewind
# bisect --cmd` localizes the fault (one process of train.py serving every probe), iteration 20's
# checkpoint is written as nanoGPT's ckpt.pt and train.py resumes from it (recorded as steps
# 20-24), and `rewind doctor --cmd` runs two iterations twice. Where torch has no SDPA (< 2.0) nanoGPT takes its
# manual attention branch, so the check also sets its `self.flash` to True there.
# Usage: bash experiments/python_record/nanogpt_check.sh NANOGPT_DIR BUILD OUT   (PYTHON; PER_PROBE=1
#        also runs the bisect again with a train.py process a probe, --script-per-probe)
#   Data-parallel, as nanoGPT runs on several GPUs (DDP, NCCL; doctor runs one process):
#   LAUNCH="torchrun --standalone --nproc_per_node 2" DEVICE=cuda DTYPE=bfloat16 bash ...
#   SKIP_DOCTOR=1 leaves out the doctor run.
set -euo pipefail
[[ $# -eq 3 ]] || { echo "usage: $0 NANOGPT_DIR BUILD OUT" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
NANOGPT=$(cd "$1" && pwd)
BUILD=$(cd "$2" && pwd)
mkdir -p "$3"
OUT=$(cd "$3" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH=$BUILD/python
export CUBLAS_WORKSPACE_CONFIG=:4096:8
W=$OUT/work
rm -rf "$W"
mkdir -p "$W/data/synth"
"$PY" "$HERE/nanogpt_diff.py" "$ROOT/docs/nanogpt.md" "$NANOGPT" "$W" | tee "$OUT/nanogpt_check.txt"
cp "$NANOGPT/configurator.py" "$W/"
if [[ -e "$NANOGPT/.git" ]]; then  # (a copy of its files alone: no commit to name)
  git -C "$NANOGPT" log -1 --format='nanoGPT %h %s' | tee -a "$OUT/nanogpt_check.txt"
fi
"$PY" - "$W/train.py" "$W/model.py" <<'PY'
import sys
import torch
train, model = sys.argv[1:3]
s = open(train).read()
assert "checkpoint_every=50," in s
open(train, "w").write(s.replace("checkpoint_every=50,",
                                 'checkpoint_every=10, plan_from={20: "L1.H0.pv=fault(strength=1e30)"},'))
if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
    m = open(model).read()
    line = "self.flash = hasattr(torch.nn.functional, 'scaled_dot_product_attention')"
    assert line in m
    open(model, "w").write(m.replace(line, "self.flash = True  # nanogpt_check.sh: torch < 2.0, rewind.attention all the same"))
PY
"$BUILD/rewind" data synth -o "$W/data/synth/train.bin" --tokens 200000 --vocab 64 > /dev/null
"$BUILD/rewind" data synth -o "$W/data/synth/val.bin" --tokens 20000 --vocab 64 --seed 2 > /dev/null
"$PY" -c 'import pickle, sys; pickle.dump({"vocab_size": 64}, open(sys.argv[1], "wb"))' "$W/data/synth/meta.pkl"
ARGS="--dataset=synth --device=${DEVICE:-cpu} --compile=False --dtype=${DTYPE:-float32} --n_layer=2 --n_head=2 --n_embd=64 \
--block_size=64 --batch_size=4 --gradient_accumulation_steps=2 --max_iters=29 --eval_interval=1000 --eval_iters=2 \
--log_interval=1 --bias=False --dropout=0.0 --warmup_iters=5 --lr_decay_iters=100 --out_dir=out"
CMD="${LAUNCH:-$PY} train.py $ARGS"
cd "$W"
source "$HERE/timed.sh"
run() { timed_run "$OUT" "$OUT/nanogpt_check.txt" "$@"; }  # run NAME CMD...: output in OUT/NAME.txt
run record $CMD
grep -E "^iter (0|19|20|29):" "$OUT/record.txt" | tee -a "$OUT/nanogpt_check.txt"
run replay "$BUILD/rewind" replay --cmd "$CMD" --store out/run.db --from 12 --to 18 --verify
tail -2 "$OUT/replay.txt" | tee -a "$OUT/nanogpt_check.txt"
rm -f "$OUT/starts"
run bisect "$BUILD/rewind" bisect --cmd "echo >> $OUT/starts; $CMD" --store out/run.db --window 20:29 --fail nan --quiet
grep -E "^verdict|failing set|^probes" "$OUT/bisect.txt" | tee -a "$OUT/nanogpt_check.txt"
echo "train.py processes the bisect started: $(wc -l < "$OUT/starts")" | tee -a "$OUT/nanogpt_check.txt"
if [[ "${PER_PROBE:-0}" == 1 ]]; then  # the same bisect with a train.py process a probe (the baseline)
  run bisect_per_probe "$BUILD/rewind" bisect --cmd "$CMD" --store out/run.db --window 20:29 --fail nan --quiet \
    --fresh --script-per-probe
  grep -E "^probes" "$OUT/bisect_per_probe.txt" | tee -a "$OUT/nanogpt_check.txt"
fi
# Iteration 20's checkpoint as nanoGPT's ckpt.pt (Run.export_nanogpt), and nanoGPT's own
# --init_from=resume from it, recorded: its steps keep the run's numbering (rewind.record's start).
mkdir -p out_resume
"$PY" -c 'import sys, rewind; rewind.open(sys.argv[1]).run().export_nanogpt(20, sys.argv[2])' out/run.db out_resume/ckpt.pt
run resume $CMD --init_from=resume --out_dir=out_resume --max_iters=24
"$BUILD/rewind" store info out_resume/run.db | grep -E "^  steps|checkpoints:" | sed 's/^ */resumed run: /' \
  | tee -a "$OUT/nanogpt_check.txt"
[[ ${SKIP_DOCTOR:-0} == 1 ]] && exit 0
run doctor "$BUILD/rewind" doctor --cmd "$PY train.py $ARGS --out_dir=out_doctor"
tail -2 "$OUT/doctor.txt" | tee -a "$OUT/nanogpt_check.txt"
