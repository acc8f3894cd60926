"""Test fixture for rewind's nanoGPT interop: a small nanoGPT-equivalent GPT (written for these
tests, same parameter names and math as nanoGPT's model.py) trained for a few iterations on the
CPU and saved as train.py saves ckpt.pt; plus checks on checkpoints rewind exports.

  make DIR [--bias] [--prefix] [--mask] [--iters K] [--shape L,H,C,T,V]
                                                       train.bin, ckpt.pt, batch.json in DIR
  compare A B                                          exit 1 unless A's and B's contents agree bit for bit
  resume CKPT DATA                                     strict load + one train.py-style step
  break SRC DST KIND                                   a damaged copy of SRC (see BREAKS)
"""
import argparse
import json
import math
import sys

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

SHAPE = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50, dropout=0.0)


class Attention(nn.Module):
    def __init__(self, a, mask):
        super().__init__()
        self.c_attn = nn.Linear(a["n_embd"], 3 * a["n_embd"], bias=a["bias"])
        self.c_proj = nn.Linear(a["n_embd"], a["n_embd"], bias=a["bias"])
        self.n_head = a["n_head"]
        if mask:  # nanoGPT keeps the causal mask as a buffer when torch lacks flash attention
            t = a["block_size"]
            self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.c_fc = nn.Linear(a["n_embd"], 4 * a["n_embd"], bias=a["bias"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * a["n_embd"], a["n_embd"], bias=a["bias"])

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, a, mask):
        super().__init__()
        self.ln_1 = nn.LayerNorm(a["n_embd"], elementwise_affine=True)
        self.attn = Attention(a, mask)
        self.ln_2 = nn.LayerNorm(a["n_embd"])
        self.mlp = Mlp(a)
        if not a["bias"]:
            self.ln_1.bias = None
            self.ln_2.bias = None

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, a, mask=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(a["vocab_size"], a["n_embd"]),
            wpe=nn.Embedding(a["block_size"], a["n_embd"]),
            h=nn.ModuleList([Block(a, mask) for _ in range(a["n_layer"])]),
            ln_f=nn.LayerNorm(a["n_embd"])))
        if not a["bias"]:
            self.transformer.ln_f.bias = None
        self.lm_head = nn.Linear(a["n_embd"], a["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as in nanoGPT

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizers(self, weight_decay, lr, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


def get_lr(cfg, it):
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
    if it > cfg["lr_decay_iters"]:
        return cfg["min_lr"]
    ratio = (it - cfg["warmup_iters"]) / (cfg["lr_decay_iters"] - cfg["warmup_iters"])
    return cfg["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg["learning_rate"] - cfg["min_lr"])


def batch(data, offsets, block):
    x = torch.stack([torch.from_numpy(data[i:i + block].astype(np.int64)) for i in offsets])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block].astype(np.int64)) for i in offsets])
    return x, y


def train_iter(model, opt, cfg, data, it, gen):
    lr = get_lr(cfg, it)
    for g in opt.param_groups:
        g["lr"] = lr
    offsets = torch.randint(len(data) - cfg["block_size"] - 1, (cfg["batch_size"],), generator=gen).tolist()
    loss = model(*batch(data, offsets, cfg["block_size"]))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
    opt.step()
    opt.zero_grad(set_to_none=True)


def make(args):
    torch.manual_seed(1337)
    a = dict(SHAPE, bias=args.bias)
    if args.shape:
        a.update(zip(("n_layer", "n_head", "n_embd", "block_size", "vocab_size"), map(int, args.shape.split(","))))
    cfg = dict(batch_size=4, block_size=a["block_size"], gradient_accumulation_steps=1,
               learning_rate=3e-3, max_iters=100, weight_decay=0.1, beta1=0.9, beta2=0.95,
               grad_clip=1.0, decay_lr=True, warmup_iters=3, lr_decay_iters=100, min_lr=3e-4,
               n_layer=a["n_layer"], n_head=a["n_head"], n_embd=a["n_embd"], dropout=0.0,
               bias=args.bias, dataset="fixture", init_from="scratch", dtype="bfloat16")
    rng = np.random.default_rng(7)
    data = rng.integers(0, a["vocab_size"], size=max(4000, 8 * a["block_size"])).astype(np.uint16)
    data.tofile(f"{args.dir}/train.bin")
    model = GPT(a, mask=args.mask)
    with torch.no_grad():  # non-trivial biases and LayerNorm weights, so the test sees them
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.05 * torch.randn_like(p))
    opt = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
    gen = torch.Generator().manual_seed(3)
    for it in range(args.iters):
        train_iter(model, opt, cfg, data, it, gen)
    lr = get_lr(cfg, args.iters)
    for g in opt.param_groups:
        g["lr"] = lr
    state = model.state_dict()
    if args.prefix:  # what torch.compile's wrapper leaves in the keys
        state = {"_orig_mod." + k: v for k, v in state.items()}
    offsets = [0, 100, 1234, 3000]
    with torch.no_grad():
        loss = model(*batch(data, offsets, cfg["block_size"])).item()
    torch.save({"model": state, "optimizer": opt.state_dict(), "model_args": a,
                "iter_num": args.iters, "best_val_loss": torch.tensor(loss), "config": cfg},
               f"{args.dir}/ckpt.pt")
    with open(f"{args.dir}/batch.json", "w") as f:
        json.dump({"offsets": offsets, "loss": loss}, f)


def same(x, y, where):
    if isinstance(x, torch.Tensor):
        bits = (lambda t: t.reshape(-1).view(torch.int32)) if x.dtype == torch.float32 else (lambda t: t)
        if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
                and torch.equal(bits(x), bits(y))):
            raise SystemExit(f"differs: {where}")
    elif isinstance(x, dict):
        if not isinstance(y, dict) or sorted(x.keys(), key=str) != sorted(y.keys(), key=str):
            raise SystemExit(f"differs: {where} keys {sorted(x, key=str)} vs {sorted(y, key=str) if isinstance(y, dict) else y}")
        for k in x:
            same(x[k], y[k], f"{where}.{k}")
    elif isinstance(x, (list, tuple)):
        if len(x) != len(y) or type(x) != type(y):
            raise SystemExit(f"differs: {where}: {x} vs {y}")
        for i, (p, q) in enumerate(zip(x, y)):
            same(p, q, f"{where}[{i}]")
    elif x != y or type(x) != type(y):
        raise SystemExit(f"differs: {where}: {x!r} vs {y!r}")


def compare(args):
    same(torch.load(args.a), torch.load(args.b), "ckpt")
    print("identical")


def resume(args):
    """What train.py's init_from='resume' does, then one iteration."""
    ck = torch.load(args.ckpt, map_location="cpu")
    state = ck["model"]
    for k in list(state):
        if k.startswith("_orig_mod."):
            state[k[len("_orig_mod."):]] = state.pop(k)
    a = ck["model_args"]
    mask = any(k.endswith(".attn.bias") for k in state)
    model = GPT(a, mask=mask)
    model.load_state_dict(state, strict=True)
    cfg = ck["config"]
    opt = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
    opt.load_state_dict(ck["optimizer"])
    data = np.fromfile(args.data, dtype=np.uint16)
    train_iter(model, opt, cfg, data, ck["iter_num"], torch.Generator().manual_seed(5))
    print(f"resumed at iter {ck['iter_num']}")


# Damages rewind must refuse, naming the key: name -> function of the checkpoint dict.
BREAKS = {
    "missing": lambda ck: ck["model"].pop("transformer.h.1.mlp.c_fc.weight"),
    "shape": lambda ck: ck["model"].update({"transformer.h.0.attn.c_proj.weight": torch.zeros(32, 16)}),
    "extra": lambda ck: ck["model"].update({"transformer.h.0.attn.rotary": torch.zeros(4)}),
    "untied": lambda ck: ck["model"].update({"lm_head.weight": ck["model"]["lm_head.weight"] + 1}),
    "moment": lambda ck: ck["optimizer"]["state"][0].update({"exp_avg": torch.zeros(3)}),
    "not_nanogpt": lambda ck: [ck.pop(k) for k in ("model_args", "iter_num")],
    "heads": lambda ck: ck["model_args"].update({"n_head": 3}),
}


def damage(args):
    ck = torch.load(args.src)
    if args.kind == "list":
        ck = [1, 2, 3]
    else:
        BREAKS[args.kind](ck)
    torch.save(ck, args.dst)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--bias", action="store_true")
    m.add_argument("--prefix", action="store_true")
    m.add_argument("--mask", action="store_true")
    m.add_argument("--iters", type=int, default=5)
    m.add_argument("--shape", help="n_layer,n_head,n_embd,block_size,vocab_size")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    r = sub.add_parser("resume")
    r.add_argument("ckpt")
    r.add_argument("data")
    b = sub.add_parser("break")
    b.add_argument("src")
    b.add_argument("dst")
    b.add_argument("kind", choices=sorted(BREAKS) + ["list"])
    args = p.parse_args()
    {"make": make, "compare": compare, "resume": resume, "break": damage}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
