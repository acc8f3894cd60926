"""The host time rewind.record adds to a step (the target: recording <= 3% of the mean step), per
call: rec.batch (less the script's own get_batch) and rec.step, and inside rec.step the
parameter digest (on the CPU a pass over every parameter word; on a GPU queued kernels), for
train_gpt.py's model. No checkpoint falls in the timed steps.

    PYTHONPATH=build/python python3 experiments/python_record/host_bench.py --preset tiny
    PYTHONPATH=build/python python3 experiments/python_record/host_bench.py --preset gpt2-small --batch 1 --block 64
    ... --profile 20   # cProfile of rec.batch + rec.step over 20 steps, top functions by own time
    ... --no-digest    # the recorder less the digest's sum (on the CPU most of rec.step's time at
                       # gpt2-small's 124M parameters; on a GPU one kernel launch per parameter)
"""
import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rewind  # noqa: E402
from rewind import _C  # noqa: E402
from train_gpt import GPT, PRESETS  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--batch", type=int, help="batch size (default: the preset's)")
    ap.add_argument("--block", type=int, help="tokens per sequence (default: the preset's block size)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS", help="cProfile the recorder's calls")
    ap.add_argument("--no-digest", action="store_true", help="digest no parameters (times the rest)")
    a = ap.parse_args()
    n_layer, n_head, n_embd, block, vocab, batch = PRESETS[a.preset]
    batch, block = a.batch or batch, a.block or block
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(1337)
    model = GPT(n_layer, n_head, n_embd, block, vocab, "rewind").to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(vocab, (1 << 16,), generator=torch.Generator().manual_seed(0))

    def get_batch():
        ix = torch.randint(len(data) - block - 1, (batch,))
        x = torch.stack([data[i:i + block] for i in ix]).to(a.device)
        y = torch.stack([data[i + 1:i + 1 + block] for i in ix]).to(a.device)
        return x, y

    times = {"batch": [], "step": [], "digest": [], "loop": []}
    got = [0.0]

    def timed_get_batch():
        t = time.perf_counter()
        out = get_batch()
        got[0] = time.perf_counter() - t
        return out

    with tempfile.TemporaryDirectory() as d:
        rec = rewind.record(os.path.join(d, "run.db"), model, opt, checkpoint_every=1 << 30)
        if a.no_digest:  # reaches into the recorder: a measurement, not an API
            if hasattr(rec._rec, "set_params"):
                rec._rec.set_params([])
            else:  # the recorder before queue_step digested in Python
                full = _C.param_digest_queued
                _C.param_digest_queued = lambda params: full([])
        prof = cProfile.Profile() if a.profile else None
        autocast = torch.autocast("cuda" if a.device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
        for it in range(a.steps + a.profile):
            t0 = time.perf_counter()
            if prof and it >= a.steps:
                prof.enable()
            x, y = rec.batch(timed_get_batch)
            t1 = time.perf_counter()
            if prof:
                prof.disable()
            with autocast:
                loss = model(x, y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            t2 = time.perf_counter()
            if prof and it >= a.steps:
                prof.enable()
            rec.step(loss=loss, grad_norm=norm)
            t3 = time.perf_counter()
            if prof:
                prof.disable()
            if a.warmup <= it < a.steps:
                times["batch"].append(t1 - t0 - got[0])
                times["step"].append(t3 - t2)
                times["loop"].append(t3 - t0)
                t = time.perf_counter()
                _C.param_digest_queued([] if a.no_digest else list(model.parameters()))
                times["digest"].append(time.perf_counter() - t)
        rec.close()
    ms = {k: 1e3 * statistics.mean(v) for k, v in times.items()}
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    print(json.dumps({"preset": a.preset, "batch": batch, "block": block, "device": a.device,
                      "params": sum(p.numel() for p in model.parameters()), "steps_timed": len(times["step"]),
                      "mean_ms": {k: round(v, 3) for k, v in ms.items()},
                      "median_ms": {k: round(v, 3) for k, v in med.items()},
                      "recorder_less_digest_ms": round(ms["batch"] + ms["step"] - ms["digest"], 3),
                      "recorder_share_of_step": round((ms["batch"] + ms["step"]) / ms["loop"], 4)}))
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
