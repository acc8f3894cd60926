"""The two GPT-2 models of bench.py: a nanoGPT-style one written here (Karpathy's model.py, its
training path: F.scaled_dot_product_attention, dropout 0) and Hugging Face's GPT2LMHeadModel
from a GPT2Config (nothing downloaded), at GPT-2 small's size or a tiny one for the CPU."""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

SIZES = {  # n_layer, n_head, n_embd, block_size, batch
    "full": (12, 12, 768, 1024, 8),   # GPT-2 small (124M), as nanoGPT's train_gpt2 config
    "tiny": (2, 2, 64, 32, 2),        # a CPU smoke run
}
VOCAB = {"full": {"nanogpt": 50304, "hf": 50257}, "tiny": {"nanogpt": 256, "hf": 256}}  # nanoGPT pads GPT-2's


# --- nanoGPT's model (Karpathy's model.py, training path: flash attention, dropout 0) ----------
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout, self.dropout = nn.Dropout(0.0), nn.Dropout(0.0), 0.0

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(n_embd), CausalSelfAttention(n_embd, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(n_embd), MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd), drop=nn.Dropout(0.0),
            h=nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def build(kind, size):
    """(model, loss function of (model, x, y)) with the seed's initial weights, on the CPU."""
    n_layer, n_head, n_embd, block, _ = SIZES[size]
    vocab = VOCAB[size][kind]
    torch.manual_seed(1337)
    if kind == "nanogpt":
        return GPT(n_layer, n_head, n_embd, block, vocab), lambda m, x, y: m(x, y)[1]
    import transformers
    config = transformers.GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=block,
                                     vocab_size=vocab, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                     use_cache=False)
    # rewind's attention has no dropout (instrument refuses attn_pdrop > 0 in training); SDPA is
    # what the plain model runs and what instrument replaces with attn_implementation="rewind".
    config._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(config), lambda m, x, y: m(input_ids=x, labels=x).loss
