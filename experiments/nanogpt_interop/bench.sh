#!/usr/bin/env bash
# What importing and exporting a nanoGPT checkpoint costs, against PyTorch's own torch.load and
# torch.save of the same file, measured in the same run on the same machine (wall seconds of
# the whole command for rewind, of the call alone for PyTorch). Checkpoint from the interop
# test fixture trained 1 iteration; SHAPE=n_layer,n_head,n_embd,block_size,vocab_size.
#   bash experiments/nanogpt_interop/bench.sh            (BUILD_DIR=build, SHAPE=6,6,384,256,50304)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
SHAPE="${SHAPE:-6,6,384,256,50304}"
PY="${PYTHON:-/usr/bin/python3}"
dir="$(mktemp -d /tmp/rewind_nanogpt_bench_XXXXXX)"
trap 'rm -rf "$dir"' EXIT
now() { date +%s.%N; }

"$PY" "$ROOT/tests/interop/nanogpt_fixture.py" make "$dir" --shape "$SHAPE" --iters 1
read -r t_load t_save < <("$PY" -c "
import sys, time, torch
t = time.perf_counter(); ck = torch.load(sys.argv[1]); t1 = time.perf_counter()
torch.save(ck, sys.argv[2]); print(t1 - t, time.perf_counter() - t1)" "$dir/ckpt.pt" "$dir/resaved.pt")
t0=$(now); "$BUILD/rewind" import nanogpt --ckpt "$dir/ckpt.pt" --data "$dir/train.bin" --record "$dir/run.db" >/dev/null
t1=$(now); "$BUILD/rewind" export nanogpt --store "$dir/run.db" --step 1 -o "$dir/out.pt" >/dev/null
t2=$(now)
"$PY" "$ROOT/tests/interop/nanogpt_fixture.py" compare "$dir/ckpt.pt" "$dir/out.pt"
awk -v l="$t_load" -v s="$t_save" -v a="$t0" -v b="$t1" -v c="$t2" -v mb="$(du -m "$dir/ckpt.pt" | cut -f1)" \
    -v db="$(du -m "$dir/run.db" | cut -f1)" -v shape="$SHAPE" 'BEGIN {
  printf "shape %s: ckpt.pt %d MB, store %d MB\n", shape, mb, db
  printf "torch.load %.2f s | rewind import %.2f s (x%.1f)\n", l, b - a, (b - a) / l
  printf "torch.save %.2f s | rewind export %.2f s (x%.1f)\n", s, c - b, (c - b) / s }'
