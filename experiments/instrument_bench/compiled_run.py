"""A user's training loop as it is, with rewind's loop lines and nothing in the model: bench.py's
nanoGPT-style GPT-2 small (or Hugging Face's GPT2LMHeadModel), torch.compile on, BF16 autocast,
AdamW, clipping, recorded by rewind.record(..., instrument=True). compiled_replay.sh records it,
replays a window with `rewind replay --cmd --verify` and bisects a fault planted through
REWIND_PLAN_FROM with `rewind bisect --cmd`.

    python3 compiled_run.py --store run.db --steps 30                      # GPT-2 small, cuda
    python3 compiled_run.py --store run.db --tiny --device cpu --steps 12  # a CPU smoke run
"""
import argparse
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS: before CUDA starts

import torch  # noqa: E402

import rewind  # noqa: E402
from bench_models import SIZES, VOCAB, build  # noqa: E402  (beside this file)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--model", choices=["nanogpt", "hf"], default="nanogpt")
    ap.add_argument("--tiny", action="store_true", help="2 layers, width 64, 32 tokens, batch 2")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", default="inductor", help="torch.compile's backend ('none': eager)")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    a = ap.parse_args()
    size = "tiny" if a.tiny else "full"
    *_, block, batch = SIZES[size]
    device = torch.device(a.device)
    torch.use_deterministic_algorithms(True)  # what rewind asks of a loop
    if hasattr(torch.utils, "deterministic"):
        torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if device.type == "cpu":
        torch.set_num_threads(1)
    model, loss_fn = build(a.model, size)
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    # The four loop lines: record (which instruments the model), rec.start, rec.batch, rec.step.
    rec = rewind.record(a.store, model, opt, checkpoint_every=a.checkpoint_every, checkpoint_wait=True,
                        instrument=True, config={"model": a.model, "size": size, "backend": a.backend})
    run = model if a.backend == "none" else torch.compile(model, backend=a.backend)
    vocab = VOCAB[size][a.model]

    def get_batch(step):  # synthetic tokens, a pure function of the step
        g = torch.Generator().manual_seed(1000 + step)
        t = torch.randint(vocab, (batch, block + 1), generator=g)
        return t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)

    for step in range(rec.start, a.steps):
        x, y = rec.batch(get_batch, step)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(run, x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        rec.step(loss=loss, grad_norm=norm)
        if step % 10 == 0 or step == a.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
