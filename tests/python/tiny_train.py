"""A tiny nanoGPT-like training script with rewind's lines added (marked "# rewind"), for the
record/replay tests: 2 layers, rewind.attention, dropout (so the generators matter), a
get_batch that draws from torch's, Python's and NumPy's generators, AdamW and a warmup+cosine
learning rate by iteration.

    python3 tiny_train.py --store run.db --steps 20
    rewind replay --cmd "python3 tiny_train.py --store run.db" --store run.db --from 7 --to 14 --verify

Under torchrun (WORLD_SIZE > 1; the tests use launch_ranks.py) it runs data-parallel as nanoGPT's
train.py does: gloo, DDP, each rank's generators seeded apart.
"""
import argparse
import math
import os
import random

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

import rewind  # rewind


class Block(nn.Module):
    def __init__(self, layer, n_embd, n_head, dropout):
        super().__init__()
        self.layer, self.n_head = layer, n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        y = rewind.attention(q, k, v, layer=self.layer, causal=True)  # rewind: for F.scaled_dot_product_attention
        x = x + self.drop(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class RunDependent(nn.Module):
    """What `rewind doctor` must catch (--nondeterministic): "index_add", CUDA's atomic
    index_add emulated on the CPU (the token vectors of each sequence summed into one, 16 chunks
    of them added in an order drawn from OS entropy, outside torch, as a GPU's scheduling
    orders atomics), or "noise", a random op on a generator seeded from OS entropy."""

    def __init__(self, kind, vocab, n_embd):
        super().__init__()
        self.kind = kind
        self.register_buffer("table", torch.randn(vocab, n_embd, generator=torch.Generator().manual_seed(7)) * 10)
        self.gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))

    def forward(self, idx):  # (B, T) -> (B, T, C)
        b, t = idx.shape
        if self.kind == "noise":
            return 1e-3 * torch.randn(b, t, self.table.size(1), generator=self.gen)
        rows = torch.arange(b).repeat_interleave(t).chunk(16)
        vals = self.table[idx.reshape(-1)].chunk(16)
        out = torch.zeros(b, self.table.size(1))
        for c in random.SystemRandom().sample(range(len(rows)), len(rows)):
            out.index_add_(0, rows[c], vals[c])
        return 1e-3 * out[:, None, :]


class GPT(nn.Module):
    def __init__(self, vocab, block, n_layer, n_embd, n_head, dropout, nondeterministic=None):
        super().__init__()
        self.odd = RunDependent(nondeterministic, vocab, n_embd) if nondeterministic else None
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(Block(i, n_embd, n_head, dropout) for i in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.drop = nn.Dropout(dropout)
        nn.init.normal_(self.wte.weight, std=0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.drop(self.wte(idx) + self.wpe(pos))
        if self.odd is not None:
            x = x + self.odd(idx)
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--monitor-every", type=int, default=1)
    ap.add_argument("--no-checkpoint-wait", action="store_true",
                    help="defer a checkpoint due while the writer is busy (the default of rewind.record; "
                         "the tests wait, for checkpoints at exactly 0, K, 2K, ...)")
    ap.add_argument("--n-embd", type=int, default=32)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--learnable", action="store_true", help="data with a pattern the model learns (random otherwise)")
    ap.add_argument("--no-config", action="store_true", help="record no config (layers from the monitors)")
    ap.add_argument("--plan", default="", help="the precision plan recorded with the run")
    ap.add_argument("--plan-from", action="append", default=[], metavar="STEP:SPEC",
                    help="a plan on top from STEP on (rewind.record's plan_from), e.g. a planted fault")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    ap.add_argument("--scheduler", action="store_true", help="lr from a LambdaLR (state= of rewind.record)")
    ap.add_argument("--nondeterministic", choices=["index_add", "noise"],
                    help="a run-dependent op in the forward (for rewind doctor)")
    ap.add_argument("--unseeded", action="store_true", help="no torch.manual_seed (for rewind doctor)")
    ap.add_argument("--perturb", type=int, default=-1, help="nudge a weight after this step's update")
    ap.add_argument("--exit-after", type=int, default=-1, help="leave the loop after this step (an early exit)")
    ap.add_argument("--start", type=int, default=0, help="the first step's number (a resumed loop: rewind.record's start)")
    ap.add_argument("--autocast", action="store_true", help="the forward under BF16 autocast on the CPU")
    ap.add_argument("--draw-after-init", action="store_true",
                    help="a loss scale drawn from torch's generator after the model's init, before rewind.record: "
                         "what a served probe (no init draws) cannot repeat")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    if hasattr(torch.utils, "deterministic"):  # torch >= 2.1: no NaN fill of every new tensor (docs/python.md)
        torch.utils.deterministic.fill_uninitialized_memory = False
    torch.set_num_threads(1)
    rank = 0
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        torch.distributed.init_process_group("gloo")
        rank = torch.distributed.get_rank()
    if not a.unseeded:
        torch.manual_seed(1337 + rank)
    random.seed(1337 + rank)
    np.random.seed(1337 + rank)
    vocab, block, batch = 64, 16, 4
    data = torch.from_numpy(np.random.RandomState(a.data_seed).randint(0, vocab, 4096)).long()
    if a.learnable:  # each token a function of the two before it: attention pays off
        for i in range(2, len(data)):
            data[i] = (data[i - 1] + 3 * data[i - 2] + 1) % vocab

    def get_batch():
        ix = torch.randint(len(data) - block - 8, (batch,)) + random.randrange(4) + int(np.random.randint(4))
        x = torch.stack([data[i:i + block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
        return x, y

    model = GPT(vocab, block, n_layer=2, n_embd=a.n_embd, n_head=2, dropout=0.1, nondeterministic=a.nondeterministic)
    raw_model = model
    if torch.distributed.is_available() and torch.distributed.is_initialized():  # rank 0's weights, broadcast by DDP
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    config = {"n_layer": 2, "n_head": 2, "n_embd": a.n_embd, "block_size": block, "vocab_size": vocab,
              "dropout": 0.1, "out_dir": "out"}  # as nanoGPT's config dict: keys rewind train lacks
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 0.9 ** it) if a.scheduler else None
    plan_from = {int(x.split(":", 1)[0]): x.split(":", 1)[1] for x in a.plan_from}
    scale = 1 + 1e-3 * float(torch.rand(())) if a.draw_after_init else 1.0
    rec = rewind.record(a.store, raw_model, opt, checkpoint_every=a.checkpoint_every, plan=a.plan,
                        plan_from=plan_from, config=None if a.no_config else config,
                        state={"sched": sched} if sched else None,
                        checkpoint_wait=not a.no_checkpoint_wait, start=a.start,
                        monitor_every=a.monitor_every)  # rewind
    for it in range(rec.start, a.steps):  # rewind: rec.start (0, or the checkpoint a replay starts at)
        lr = a.lr * min(1.0, (it + 1) / 5) * 0.5 * (1 + math.cos(math.pi * it / a.steps))
        if sched:
            lr = sched.get_last_lr()[0]
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = rec.batch(get_batch)  # rewind: was x, y = get_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
            loss = model(x, y) * scale
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sched:
            sched.step()
        if it == a.perturb:
            with torch.no_grad():
                raw_model.wte.weight[0, 0] += 1e-3
        rec.step(loss=loss, grad_norm=norm, lr=lr)  # rewind
        print(f"iter {it}: loss {loss.item():.4f} grad norm {norm.item():.4f}")
        if it == a.exit_after:
            break
    rec.close()  # rewind


if __name__ == "__main__":
    main()
