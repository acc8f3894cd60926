#!/usr/bin/env python3
"""The user's own step: a nanoGPT-equivalent GPT-2 in plain PyTorch, the speed baseline that
rewind's recorded step is compared with (scripts/gpu_bench.sh runs both in one call).

Same shapes, data and optimizer settings as `rewind train --preset gpt2-small`: pre-LayerNorm
blocks without biases, GELU MLP 4x, tied head, BF16 autocast, SDPA (flash) attention, fused
AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), warmup + cosine LR, grad clip 1.0.

  python3 torch_baseline.py --data train.bin --mode eager|deterministic|compile [--steps 22]
  torchrun --standalone --nproc-per-node N torch_baseline.py --data train.bin --accum 2

Under torchrun (WORLD_SIZE > 1) it is PyTorch DDP over NCCL, as nanoGPT's train.py runs it: each
rank takes --accum micro-batches a step, gradients all-reduced (bucketed, overlapped with the
backward) on the last one only (no_sync before). The global batch is N x accum x batch x block.

Prints one line per timed step and a summary line (rank 0):
  torch-baseline mode=eager median_ms=32.8 p25_ms=.. p75_ms=.. tokens_per_s=250000 last_loss=..
and with --memory (CUDA) one more, the peak memory of the caching allocator:
  torch-baseline-memory mode=eager batch=8 max_allocated_gib=9.12 max_reserved_gib=10.05
"""
import argparse
import contextlib
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd, bias=False) if _ln_has_bias_arg() else nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.ln_2 = nn.LayerNorm(n_embd, bias=False) if _ln_has_bias_arg() else nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = _attention(q, k, v)  # (B, H, T, D)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


def _attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2: flash / cuDNN kernels
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)  # torch 1.x (a CPU smoke test only): materialized causal softmax
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def _ln_has_bias_arg():
    return "bias" in nn.LayerNorm.__init__.__code__.co_varnames


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=False) if _ln_has_bias_arg() else nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as nanoGPT
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def lr_at(it, lr=1e-3, min_lr=1e-5, warmup=2000, decay=600000):
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    ratio = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="uint16 token file (rewind data synth / nanoGPT train.bin)")
    ap.add_argument("--mode", choices=["eager", "deterministic", "compile"], default="eager")
    ap.add_argument("--steps", type=int, default=22)
    ap.add_argument("--warmup-steps", type=int, default=2, help="untimed first steps")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--vocab-size", type=int, default=50304)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per rank per step")
    ap.add_argument("--profile-last", type=int, default=0,
                    help="bracket the last N steps with cudaProfilerStart/Stop (ncu --profile-from-start off)")
    ap.add_argument("--memory", action="store_true",
                    help="after the summary, print the caching allocator's peaks (torch.cuda.max_memory_allocated / "
                         "max_memory_reserved since the start: model, optimizer, activations)")
    a = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:  # torchrun: one process per GPU
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", local))
        a.device = f"cuda:{local}"

    if a.mode == "deterministic":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1337)
    dev = torch.device(a.device)
    data = np.memmap(a.data, dtype=np.uint16, mode="r")
    model = GPT(a.n_layer, a.n_head, a.n_embd, a.block_size, a.vocab_size).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), **({"fused": True} if fused else {}))
    step_fn_model = torch.compile(model) if a.mode == "compile" else model
    if world > 1:
        step_fn_model = torch.nn.parallel.DistributedDataParallel(step_fn_model, device_ids=[dev.index])
    rng = np.random.default_rng(1337 + rank)

    def batch():
        ix = rng.integers(0, len(data) - a.block_size - 1, a.batch_size)
        x = torch.from_numpy(np.stack([data[i:i + a.block_size].astype(np.int64) for i in ix]))
        y = torch.from_numpy(np.stack([data[i + 1:i + 1 + a.block_size].astype(np.int64) for i in ix]))
        if fused:
            return x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
        return x.to(dev), y.to(dev)

    times, loss = [], float("nan")
    for it in range(a.steps):
        if a.profile_last and it == a.steps - a.profile_last:
            torch.cuda.synchronize(dev)
            torch.cuda.profiler.start()
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        for micro in range(a.accum):
            x, y = batch()
            last = micro == a.accum - 1
            sync = step_fn_model.no_sync() if world > 1 and not last else contextlib.nullcontext()
            with sync:  # forward and backward of a micro-batch that does not all-reduce
                with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                    l = step_fn_model(x, y) / a.accum
                l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = l.item() * a.accum  # a host sync per step, as rewind's step line has
        ms = (time.perf_counter() - t0) * 1e3
        if rank == 0:
            print(f"step {it:6d} | loss {loss:.6f} | {ms:.1f} ms", flush=True)
        if it >= a.warmup_steps:
            times.append(ms)
    if a.profile_last:
        torch.cuda.synchronize(dev)
        torch.cuda.profiler.stop()
    if not times:
        sys.exit("torch_baseline: no timed steps (raise --steps)")
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    med = statistics.median(times)
    tokens = world * a.accum * a.batch_size * a.block_size
    if rank == 0:
        print(f"torch-baseline mode={a.mode} world={world} accum={a.accum} median_ms={med:.1f} p25_ms={q[0]:.1f} "
              f"p75_ms={q[2]:.1f} tokens_per_s={tokens / (med / 1e3):.0f} last_loss={loss:.4f} "
              f"torch={torch.__version__} device={torch.cuda.get_device_name(dev) if fused else 'cpu'}")
    if a.memory and fused and rank == 0:  # experiments/train_bench/memory_bench.sh reads this line
        gib = 1024.0 ** 3
        print(f"torch-baseline-memory mode={a.mode} batch={a.batch_size} "
              f"max_allocated_gib={torch.cuda.max_memory_allocated(dev) / gib:.2f} "
              f"max_reserved_gib={torch.cuda.max_memory_reserved(dev) / gib:.2f}", flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
