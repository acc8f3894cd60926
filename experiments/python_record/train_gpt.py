"""A nanoGPT-style GPT and training loop (written for rewind; nanoGPT's parameter names) with
rewind's lines marked "# rewind", for the GPU measurements of gpu_bench.sh: the step
time with rewind.attention and rewind.record against the same loop with SDPA and no recorder,
and a bisect of a planted fault through `rewind bisect --cmd`. The attention linears, MLPs and
LM head sit in rewind.op blocks, so a plan (`replay --cmd --plan 'L1.mlp=fp32'`, a bisect's
probes) can run them in FP32.

    python3 train_gpt.py --preset gpt2-small --device cuda --attention sdpa --no-record --steps 60
    python3 train_gpt.py --preset gpt2-small --device cuda --store run.db --steps 60
    torchrun --standalone --nproc_per_node 2 train_gpt.py --store run.db   # DDP, as nanoGPT's train.py
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

import rewind  # rewind

PRESETS = {  # n_layer, n_head, n_embd, block_size, vocab_size, batch_size
    "tiny": (2, 2, 64, 64, 256, 4),
    "small": (4, 4, 128, 128, 2048, 8),  # for measurements on a CPU: steps of ~0.1-0.2 s on 2 cores
    "gpt2-small": (12, 12, 768, 1024, 50304, 8),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, layer, n_embd, n_head, attention):
        super().__init__()
        self.layer, self.n_head, self.attention = layer, n_head, attention
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.shape
        with rewind.op(f"L{self.layer}.qkv"):  # rewind: FP32 where the plan says L<i>.qkv=fp32
            qkv = self.c_attn(x)
        q, k, v = qkv.split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        if self.attention == "rewind":
            y = rewind.attention(q, k, v, layer=self.layer, causal=True)  # rewind: was SDPA
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # rewind: y is BF16 under autocast; the call form casts it to FP32 where the plan says
        # L<i>.proj=fp32 (and the output back to BF16)
        return rewind.op(f"L{self.layer}.proj")(self.c_proj, y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, layer, n_embd, n_head, attention):
        super().__init__()
        self.layer = layer
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(layer, n_embd, n_head, attention)
        self.mlp = nn.Sequential()
        self.mlp.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp.gelu = nn.GELU()
        self.mlp.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        with rewind.op(f"L{self.layer}.mlp"):  # rewind: FP32 where the plan says L<i>.mlp=fp32
            return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size, attention):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList(Block(i, n_embd, n_head, attention) for i in range(n_layer)),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        with rewind.op("head"):  # rewind: FP32 where the plan says head=fp32
            logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--attention", choices=["rewind", "sdpa"], default="rewind")
    ap.add_argument("--store", default="run.db")
    ap.add_argument("--no-record", action="store_true", help="the plain loop: no rewind.record")
    ap.add_argument("--monitors", action="store_true",
                    help="with --no-record: rewind.attention's per-head monitors on (what the recorder asks of the "
                         "kernels), dropped each step: their device cost without the recorder's")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of the timing")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--plan-from", action="append", default=[], metavar="STEP:SPEC")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--fill-uninitialized", action="store_true",
                    help="keep deterministic mode's NaN fill of every new tensor (torch >= 2.1; off here: ~1000 "
                         "fill kernels a gpt2-small step, and every op of this model writes its whole output)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the timed steps, N more under torch.profiler: the host's busiest calls (stderr)")
    a = ap.parse_args()
    n_layer, n_head, n_embd, block, vocab, batch = PRESETS[a.preset]
    cuda = a.device.startswith("cuda")
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1  # under torchrun, as nanoGPT's train.py
    rank = 0
    if ddp:
        torch.distributed.init_process_group(backend="nccl" if cuda else "gloo")
        rank = torch.distributed.get_rank()
        if cuda:
            a.device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(a.device)
    if a.attention == "rewind":  # replay needs bits that repeat; SDPA's backward does not
        torch.use_deterministic_algorithms(True)  # (CUBLAS_WORKSPACE_CONFIG: set by gpu_bench.sh)
        if hasattr(torch.utils, "deterministic") and not a.fill_uninitialized:
            torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1337 + rank)  # each rank draws its own batches (nanoGPT: seed_offset)
    data = torch.randint(vocab, (1 << 22,), generator=torch.Generator().manual_seed(0))

    def get_batch():
        ix = torch.randint(len(data) - block - 1, (batch,))
        x = torch.stack([data[i:i + block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
        if cuda:
            return x.pin_memory().to(a.device, non_blocking=True), y.pin_memory().to(a.device, non_blocking=True)
        return x, y

    raw_model = GPT(n_layer, n_head, n_embd, block, vocab, a.attention).to(a.device)
    if ddp:  # the same initial weights on every rank: rank 0's, broadcast by DDP
        model = torch.nn.parallel.DistributedDataParallel(raw_model, device_ids=[a.device] if cuda else None)
    else:
        model = raw_model
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    config = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block, vocab_size=vocab, batch_size=batch)
    rec = None
    if not a.no_record:
        plan_from = {int(x.split(":", 1)[0]): x.split(":", 1)[1] for x in a.plan_from}
        rec = rewind.record(a.store, raw_model, opt, checkpoint_every=a.checkpoint_every, config=config,
                            plan_from=plan_from)  # rewind
    start = rec.start if rec else 0  # rewind: rec.start
    if a.monitors and not rec:
        rewind._C.set_monitoring(True)
    autocast = torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16)
    t0 = None
    host = {"recorder": 0.0, "get_batch": 0.0}  # host seconds of the timed steps

    def timed_get_batch():
        t = time.perf_counter()
        out = get_batch()
        host["get_batch"] += time.perf_counter() - t
        return out

    def train_step():  # one step of the loop; the recorder's host time counted in `host`
        t = time.perf_counter()
        x, y = rec.batch(timed_get_batch) if rec else timed_get_batch()  # rewind: rec.batch
        host["recorder"] += time.perf_counter() - t
        with autocast:
            loss = model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rec:
            t = time.perf_counter()
            rec.step(loss=loss, grad_norm=norm)  # rewind
            host["recorder"] += time.perf_counter() - t
        elif a.monitors:
            rewind._C.take_monitor_stats()
        return loss

    step_s = {}  # each timed iteration's wall on the host (no sync: where the loop's thread stalled)
    for it in range(start, a.steps):
        if it == start + a.warmup:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            host = {"recorder": 0.0, "get_batch": 0.0}
        t_it = time.perf_counter()
        loss = train_step()
        if t0 is not None:
            step_s[it] = time.perf_counter() - t_it
    if cuda:
        torch.cuda.synchronize()
    end = time.perf_counter()
    recorder_s = host["recorder"] - host["get_batch"]  # of the timed steps (rec.batch's get_batch left out)
    if a.profile and cuda:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(a.profile):
                loss = train_step()
            torch.cuda.synchronize()
        for key in ("self_cpu_time_total", "self_cuda_time_total"):
            print(prof.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=60), file=sys.stderr)
    timed = a.steps - start - a.warmup
    if t0 is not None and timed > 0 and rank == 0:
        print(json.dumps({"attention": a.attention, "record": rec is not None, "preset": a.preset,
                          "ranks": torch.distributed.get_world_size() if ddp else 1,
                          "steps_timed": timed, "mean_step_ms": 1e3 * (end - t0) / timed,
                          # the host time of rec.batch and rec.step a step: in a loop whose host
                          # is the bottleneck, what the recorder adds to it
                          "recorder_host_ms": 1e3 * recorder_s / timed,
                          "last_loss": loss.item(),
                          "slowest_steps_ms": {k: round(1e3 * v, 1) for k, v in
                                               sorted(step_s.items(), key=lambda kv: -kv[1])[:3]}}))
    if rec:
        rec.close()  # rewind


if __name__ == "__main__":
    main()
