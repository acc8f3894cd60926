"""rewind.instrument on the CPU: an unedited model's attention and linears under the plan.
A tiny nanoGPT-like model (F.scaled_dot_product_attention, taken over by a TorchFunctionMode)
gives the bits of the same model edited by hand with rewind.attention and rewind.op, under every
kind of plan; a fault planted in L1.H0 changes layer 1's head 0 and nothing before it;
uninstrument gives back the model's own outputs bit for bit; what rewind cannot map (a mask,
dropout, a hand-written softmax, no blocks) is one line. A Hugging Face GPT2LMHeadModel and a
LlamaForCausalLM from small configs (transformers' attention registry) get the same checks
but the hand-edited twin. record(..., instrument=True), then `rewind replay --cmd --verify` is
bitwise and `rewind bisect --cmd` localizes a planted fault to {L1.H0.pv} (nanoGPT-like and
GPT-2). This file is also the training script those tests run:

    python3 test_instrument.py --store run.db --steps 12 [--hf gpt2|llama] [--plan-from STEP:SPEC]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn as nn
from torch.nn import functional as F

import rewind

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from script_run import REWIND, needs_rewind  # noqa: E402

try:
    import transformers
except ImportError:
    transformers = None

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
needs_sdpa = unittest.skipUnless(HAS_SDPA, f"torch {torch.__version__} has no F.scaled_dot_product_attention")
needs_hf = unittest.skipUnless(transformers is not None and HAS_SDPA,
                               "needs transformers (python3 -m pip install transformers) and torch >= 2")
VOCAB, BLOCK, EMBD, HEADS = 64, 16, 32, 2
FAULT = "L1.H0.pv=fault(strength=25600)"


class CausalSelfAttention(nn.Module):
    """nanoGPT's, with `hand`: the same module edited as the diff of docs/nanogpt.md edits it."""

    def __init__(self, layer, hand, dropout=0.0, kind="sdpa"):
        super().__init__()
        self.layer, self.hand, self.dropout, self.kind = layer, hand, dropout, kind
        self.c_attn = nn.Linear(EMBD, 3 * EMBD)
        self.c_proj = nn.Linear(EMBD, EMBD)

    def forward(self, x):
        b, t, c = x.size()
        if self.hand:
            with rewind.op(f"L{self.layer}.qkv"):
                q, k, v = self.c_attn(x).split(c, dim=2)
        else:
            q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        if self.hand:
            y = rewind.attention(q, k, v, layer=self.layer, causal=True)
        elif self.kind == "softmax":  # hand-written attention: nothing rewind can take over
            att = (q @ k.transpose(-2, -1)) / (k.size(-1) ** 0.5)
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        elif self.kind == "mask":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(t, t, dtype=torch.bool).tril())
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                               dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return rewind.op(f"L{self.layer}.proj")(self.c_proj, y) if self.hand else self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(EMBD, 4 * EMBD), nn.GELU(), nn.Linear(4 * EMBD, EMBD)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, layer, hand, **kw):
        super().__init__()
        self.layer, self.hand = layer, hand
        self.ln_1, self.ln_2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
        self.attn, self.mlp = CausalSelfAttention(layer, hand, **kw), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        if self.hand:
            with rewind.op(f"L{self.layer}.mlp"):
                return x + self.mlp(self.ln_2(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's module tree: transformer.{wte, wpe, h.<i>, ln_f}, lm_head tied to wte."""

    def __init__(self, hand=False, n_layer=2, **kw):
        super().__init__()
        self.hand = hand
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, EMBD), wpe=nn.Embedding(BLOCK, EMBD),
            h=nn.ModuleList(Block(i, hand, **kw) for i in range(n_layer)), ln_f=nn.LayerNorm(EMBD)))
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.size(1)))
        for blk in self.transformer.h:
            x = blk(x)
        x = self.transformer.ln_f(x)
        if self.hand:
            with rewind.op("head"):
                logits = self.lm_head(x)
        else:
            logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def hf_model(kind="gpt2", **overrides):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=EMBD, n_head=HEADS, n_positions=BLOCK, vocab_size=VOCAB,
                                         attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, use_cache=False)
        cls = transformers.GPT2LMHeadModel
    else:  # grouped-query attention: 2 query heads over 1 K/V head
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=EMBD, intermediate_size=64,
                                          num_attention_heads=HEADS, num_key_value_heads=1, vocab_size=VOCAB,
                                          max_position_embeddings=BLOCK, use_cache=False)
        cls = transformers.LlamaForCausalLM
    for k, v in overrides.items():
        setattr(config, k, v)
    config._attn_implementation = "sdpa"
    return cls(config)


def batch(seed=1, b=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(VOCAB, (b, BLOCK), generator=g)
    return x, torch.roll(x, -1, 1)


def bits(t):
    t = t.detach().contiguous().view(-1)
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def run(model, autocast=True, backward=True, xy=None):
    """Logits, loss and every parameter's gradient of one step on `xy` (default batch())."""
    model.zero_grad(set_to_none=True)
    x, y = batch() if xy is None else xy
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if isinstance(getattr(model, "_orig_mod", model), GPT):
            logits, loss = model(x, y)
        else:
            out = model(input_ids=x, labels=y)
            logits, loss = out.logits, out.loss
    if backward:
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters()] if backward else []
    return [logits.detach(), loss.detach()] + grads


def attn_inputs_of_proj(model, paths):
    """What each attention's output linear (c_proj / o_proj) gets: the heads side by side."""
    got, handles = {}, []
    mods = dict(model.named_modules())
    for p in paths:
        handles.append(mods[p].register_forward_pre_hook(lambda m, a, p=p: got.__setitem__(p, a[0].detach().float())))
    return got, handles


class Plan(unittest.TestCase):
    def setUp(self):
        rewind._plan_state.set_active_plan("")

    def tearDown(self):
        rewind._plan_state.set_active_plan("")

    def with_plan(self, plan, fn):
        rewind._plan_state.set_active_plan(plan)
        try:
            return fn()
        finally:
            rewind._plan_state.set_active_plan("")

    def graphs_with_blocks_compiled(self, model, blocks, plan="", **compile_args):
        """Runs `model` eagerly, then with each of `blocks` compiled on its own (torchtitan's
        way), both under `plan`: asserts the same bits and returns how many graphs dynamo made."""
        from torch._dynamo.utils import counters
        torch._dynamo.reset()
        counters.clear()
        want = self.with_plan(plan, lambda: run(model))
        for blk in blocks:
            blk.compile(backend="eager", **compile_args)
        got = self.with_plan(plan, lambda: run(model))
        self.assertTrue(all(same(u, v) for u, v in zip(want, got)), plan)
        return counters["stats"]["unique_graphs"]

    def assert_fault_in_L1_H0_only(self, model, paths):
        """FAULT changes what layer 1's head 0 hands its output linear (`paths`: layer 0's and
        layer 1's) and neither head 1 of layer 1 nor anything of layer 0."""
        got, handles = attn_inputs_of_proj(model, paths)
        run(model, backward=False)
        clean = dict(got)
        self.with_plan(FAULT, lambda: run(model, backward=False))
        for h in handles:
            h.remove()
        d = EMBD // HEADS
        self.assertTrue(torch.equal(got[paths[0]], clean[paths[0]]))                    # layer 0 as without it
        self.assertTrue(torch.equal(got[paths[1]][..., d:], clean[paths[1]][..., d:]))   # layer 1, head 1
        self.assertFalse(torch.equal(got[paths[1]][..., :d], clean[paths[1]][..., :d]))  # layer 1, head 0


@needs_sdpa
class NanoGPT(Plan):
    def models(self, **kw):
        torch.manual_seed(0)
        plain = GPT(**kw)
        hand = GPT(hand=True, **kw)
        hand.load_state_dict(plain.state_dict())
        return plain, hand

    def test_same_bits_as_the_model_edited_by_hand(self):
        plain, hand = self.models()
        rewind.instrument(plain)
        plans = ("", FAULT, "L0.H1.pv=fp32", "L*.H*.softmax=stable(beta=2)", "L0.mlp=fp32;L1.qkv=fp32",
                 "L1.proj=fp32", "L1=fp32", "head=fp32", "all=fp32")
        for autocast in (True, False):
            for plan in plans:
                a = self.with_plan(plan, lambda: run(plain, autocast))
                b = self.with_plan(plan, lambda: run(hand, autocast))
                self.assertTrue(all(same(u, v) for u, v in zip(a, b)), f"{plan!r} autocast={autocast}")
        # the plans did act: a promoted MLP and the fault give other bits than no plan
        base = run(plain)
        for plan in (FAULT, "L0.mlp=fp32", "head=fp32"):
            self.assertFalse(same(self.with_plan(plan, lambda: run(plain))[1], base[1]), plan)

    def test_a_fault_in_L1_H0_changes_that_head_only(self):
        plain, _ = self.models()
        rewind.instrument(plain)
        self.assert_fault_in_L1_H0_only(plain, ["transformer.h.0.attn.c_proj", "transformer.h.1.attn.c_proj"])

    def test_uninstrument_gives_back_the_model_bit_for_bit(self):
        plain, _ = self.models()
        before = run(plain)
        rewind.instrument(plain)
        m = rewind.instrumented(plain)
        self.assertEqual(m["transformer.h.1.attn"], "L1 attention")
        self.assertEqual(m["transformer.h.1.attn.c_attn"], "L1.qkv")
        self.assertEqual(m["transformer.h.0.mlp"], "L0.mlp")
        self.assertEqual(m["lm_head"], "head")
        self.assertIs(rewind.instrument(plain), plain)  # twice: unchanged
        self.assertFalse(all(same(u, v) for u, v in zip(before, run(plain))))  # rewind's attention now
        rewind.uninstrument(plain)
        self.assertIsNone(rewind.instrumented(plain))
        self.assertTrue(all("forward" not in m.__dict__ for m in plain.modules()))
        self.assertTrue(all(same(u, v) for u, v in zip(before, run(plain))))

    def assert_one_line(self, fn, *texts):
        with self.assertRaises(rewind.RewindError) as cm:
            fn()
        msg = str(cm.exception)
        self.assertEqual(len(msg.splitlines()), 1, msg)
        for t in texts:
            self.assertIn(t, msg)

    def test_what_it_cannot_map_is_one_line(self):
        for kw, texts in ((dict(kind="softmax"), ("transformer.h.0.attn ran no F.scaled_dot_product_attention",)),
                          (dict(kind="mask"), ("transformer.h.0", "attn_mask")),
                          (dict(dropout=0.1), ("transformer.h.0", "dropout_p=0.1"))):
            plain, _ = self.models(**kw)
            plain.train()
            rewind.instrument(plain)
            self.assert_one_line(lambda: run(plain), *texts)
            rewind.uninstrument(plain)
        plain, _ = self.models(dropout=0.1)
        rewind.instrument(plain).eval()  # no dropout in eval: SDPA gets dropout_p=0
        run(plain, backward=False)
        self.assert_one_line(lambda: rewind.instrument(nn.Sequential(nn.Linear(4, 4))), "nn.ModuleList of blocks")
        no_mlp = GPT()
        del no_mlp.transformer.h[1].mlp
        self.assert_one_line(lambda: rewind.instrument(no_mlp), "transformer.h.1", "no MLP")
        self.assertIsNone(rewind.instrumented(no_mlp))
        self.assertTrue(all("forward" not in m.__dict__ for m in no_mlp.modules()))  # nothing left behind
        self.assert_one_line(lambda: rewind.uninstrument(GPT()), "not instrumented")

    def test_a_data_parallel_wrapper_is_seen_through(self):
        plain, _ = self.models()
        wrapped = nn.DataParallel(plain)
        self.assertIs(rewind.instrument(wrapped), wrapped)
        self.assertEqual(rewind.instrumented(plain)["lm_head"], "head")  # paths of the model inside
        rewind.uninstrument(wrapped)
        self.assertIsNone(rewind.instrumented(plain))

    @unittest.skipUnless(hasattr(torch, "compile"), "torch.compile needs torch >= 2")
    def test_compiled_instrumented_model_keeps_the_bits(self):
        """torch.compile over the instrumented model (dynamo's graphs run eagerly: the bits are the
        eager model's where rewind's wrappers traced right), the plan changed between calls,
        instrument and uninstrument on a model compiled and run before."""
        plain, _ = self.models()
        compiled = torch.compile(plain, backend="eager")
        before = run(compiled)  # compiled before instrument: its code must not outlive it
        rewind.instrument(compiled)
        self.assertEqual(rewind.instrumented(compiled)["lm_head"], "head")
        for plan in ("", FAULT, "L0.mlp=fp32", "head=fp32", ""):
            got = self.with_plan(plan, lambda: run(compiled))
            want = self.with_plan(plan, lambda: run(plain))
            self.assertTrue(all(same(u, v) for u, v in zip(want, got)), plan)
        rewind.uninstrument(compiled)
        self.assertTrue(all(same(u, v) for u, v in zip(before, run(compiled))))

    @unittest.skipUnless(rewind._compiled.available(), "torch.library.register_fake needs torch >= 2.4")
    def test_compiled_model_is_one_graph_with_the_eager_bits(self):
        """The whole model under fullgraph=True (a graph break would raise): rewind's attention
        is a custom op in dynamo's graph, its autograd formula traced by AOTAutograd (aot_eager).
        Same bits as the eager instrumented model, with and without a plan."""
        plain, _ = self.models()
        rewind.instrument(plain)
        want = {plan: self.with_plan(plan, lambda: run(plain)) for plan in ("", FAULT)}
        compiled = torch.compile(plain, backend="aot_eager", fullgraph=True)
        for plan in ("", FAULT, ""):
            got = self.with_plan(plan, lambda: run(compiled))
            self.assertTrue(all(same(u, v) for u, v in zip(want[plan], got)), plan)

    @unittest.skipUnless(rewind._compiled.available(), "torch.library.register_fake needs torch >= 2.4")
    def test_blocks_compiled_one_by_one_share_their_graphs(self):
        """block.compile() on every block (torchtitan's way): without a plan nothing per layer
        is a constant of the trace, so 12 blocks compile 2 graphs (dynamo's first call and its
        automatic-dynamic retrace), not one per layer past the recompile limit."""
        plain, _ = self.models(n_layer=12)
        rewind.instrument(plain)
        self.assertLessEqual(self.graphs_with_blocks_compiled(plain, plain.transformer.h, fullgraph=True), 3)

    @unittest.skipUnless(rewind._compiled.available(), "torch.library.register_fake needs torch >= 2.4")
    def test_blocks_compiled_one_by_one_share_their_graphs_under_a_plan(self):
        """The same under a plan that faults a head of layer 1 and promotes layer 2's MLP: a
        block guards on the plan's answer for it, not on its layer, so the blocks the plan
        leaves alone share their graphs and only layer 2's differs; the bits are eager's."""
        plain, _ = self.models(n_layer=12)
        rewind.instrument(plain)
        # The graphs without a plan (3) and layer 2's: its block's, its MLP's and their resumes
        # (4); a guard per layer made 11 here, past dynamo's recompile limit.
        graphs = self.graphs_with_blocks_compiled(plain, plain.transformer.h, FAULT + ";L2.mlp=fp32")
        self.assertLessEqual(graphs, 7)

    @unittest.skipUnless(hasattr(torch, "compile") and os.environ.get("REWIND_TEST_INDUCTOR") == "1",
                         "inductor on the CPU: REWIND_TEST_INDUCTOR=1 (~80 s of compiling on 2 cores)")
    def test_inductor_gives_the_bits_of_the_hand_edited_model_compiled(self):
        """Inductor's fused kernels round otherwise than eager, so the reference is the model
        edited by hand, compiled alike; dynamo is reset between the two (they share code
        objects). Under deterministic algorithms, as rewind asks of a loop: without them
        inductor's CPU embedding backward adds with atomics, and the tied weight's gradient
        changes from one compile to the next."""
        plain, hand = self.models()
        rewind.instrument(plain)
        torch.use_deterministic_algorithms(True)
        try:
            for plan in ("", FAULT):
                torch._dynamo.reset()
                got = self.with_plan(plan, lambda: run(torch.compile(plain)))
                torch._dynamo.reset()
                want = self.with_plan(plan, lambda: run(torch.compile(hand)))
                self.assertTrue(all(same(u, v) for u, v in zip(want, got)), plan)
        finally:
            torch.use_deterministic_algorithms(False)
            torch._dynamo.reset()


class AnyTorch(unittest.TestCase):
    def test_refused_in_one_line_where_it_cannot_run(self):
        model = GPT() if not HAS_SDPA else nn.Sequential(nn.Linear(4, 4))
        with self.assertRaises(rewind.RewindError) as cm:
            rewind.instrument(model)
        msg = str(cm.exception)
        self.assertEqual(len(msg.splitlines()), 1, msg)
        self.assertIn("scaled_dot_product_attention" if not HAS_SDPA else "nn.ModuleList of blocks", msg)


@needs_hf
class HuggingFace(Plan):
    def check_model(self, kind, proj):
        model = hf_model(kind)
        before = run(model)
        rewind.instrument(model)
        self.assertEqual(model.config._attn_implementation, "rewind")
        paths = [f"transformer.h.{i}.attn.{proj}" if kind == "gpt2" else f"model.layers.{i}.self_attn.{proj}"
                 for i in (0, 1)]
        self.assert_fault_in_L1_H0_only(model, paths)
        self.assertFalse(same(self.with_plan("L0.mlp=fp32", lambda: run(model))[1], run(model)[1]))
        rewind.uninstrument(model)
        self.assertEqual(model.config._attn_implementation, "sdpa")
        self.assertTrue(all(same(u, v) for u, v in zip(before, run(model))))
        return model

    def test_gpt2(self):
        self.check_model("gpt2", "c_proj")

    def test_llama(self):
        self.check_model("llama", "o_proj")

    @unittest.skipUnless(rewind._compiled.available(), "torch.library.register_fake needs torch >= 2.4")
    def test_whole_model_compiled(self):
        """torch.compile(model) of Hugging Face's GPT-2 and Llama: while tracing transformers
        builds an explicit causal mask unless the mask function says none is needed; rewind's
        does, without a padding mask. The eager instrumented model's bits."""
        for kind in ("gpt2", "llama"):
            model = rewind.instrument(hf_model(kind))
            want = {plan: self.with_plan(plan, lambda: run(model)) for plan in ("", FAULT)}
            compiled = torch.compile(model, backend="eager")
            for plan in ("", FAULT):
                got = self.with_plan(plan, lambda: run(compiled))
                self.assertTrue(all(same(u, v) for u, v in zip(want[plan], got)), (kind, plan))

    @unittest.skipUnless(rewind._compiled.available(), "torch.library.register_fake needs torch >= 2.4")
    def test_blocks_compiled_one_by_one_share_their_graphs(self):
        """GPT-2's 12 blocks compiled one by one: nothing per layer (not even the module path a
        refusal would name) is read while tracing, so one graph serves every block."""
        model = rewind.instrument(hf_model("gpt2", n_layer=12))
        self.assertLessEqual(self.graphs_with_blocks_compiled(model, model.transformer.h), 2)

    @unittest.skipUnless(rewind._compiled.available(), "torch.library.register_fake needs torch >= 2.4")
    def test_blocks_compiled_one_by_one_share_their_graphs_under_a_plan(self):
        """Under a plan that faults a head of layer 1 the blocks keep one graph: each guards on
        the plan's answer for its attention (the BF16 kernels, for all of them), not its layer."""
        model = rewind.instrument(hf_model("gpt2", n_layer=12))
        self.assertLessEqual(self.graphs_with_blocks_compiled(model, model.transformer.h, FAULT), 2)

    def test_what_it_cannot_map_is_one_line(self):
        model = rewind.instrument(hf_model("gpt2", attn_pdrop=0.1))
        model.train()
        with self.assertRaisesRegex(rewind.RewindError, "transformer.h.0.attn asks for attention dropout 0.1") as cm:
            run(model)
        self.assertEqual(len(str(cm.exception).splitlines()), 1)
        model = rewind.instrument(hf_model("gpt2"))
        x, y = batch()
        mask = torch.ones_like(x)
        mask[0, -3:] = 0  # padding
        with self.assertRaisesRegex(rewind.RewindError, "transformer.h.0.attn got an attention mask"):
            model(input_ids=x, attention_mask=mask)
        model(input_ids=x, attention_mask=torch.ones_like(x))  # all ones: no mask, plain causal
        model = rewind.instrument(hf_model("gpt2", scale_attn_by_inverse_layer_idx=True))
        with self.assertRaisesRegex(rewind.RewindError, "transformer.h.1.attn scales its attention logits"):
            run(model, backward=False)


@needs_rewind
@needs_sdpa
class RecordReplay(unittest.TestCase):
    """record(..., instrument=True) on an unedited model, then `rewind replay --cmd --verify`,
    and `rewind bisect --cmd` over a fault that turns the loss NaN."""

    def record(self, d, *args):
        store = os.path.join(d, "run.db")
        cmd = [sys.executable, os.path.abspath(__file__), "--store", store, "--steps", "12", *args]
        r = subprocess.run(cmd, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return store, " ".join(f"'{a}'" for a in cmd)

    def check(self, *args):
        with tempfile.TemporaryDirectory() as d:
            store, shell = self.record(d, *args)
            run = rewind.open(store).run()
            ops = run.kv("ops")["ops"]
            for name in ("L0.qkv", "L1.proj", "L1.mlp", "L0.ln"):
                self.assertIn(name, ops)
            self.assertIn("L1.H0.max_logit", run.metrics())  # rewind's attention ran, with its monitors
            r = subprocess.run([REWIND, "replay", "--cmd", shell, "--store", store, "--from", "3", "--to", "9",
                                "--verify"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("bitwise identical", r.stdout)
        with tempfile.TemporaryDirectory() as d:
            store, shell = self.record(d, *args, "--plan-from", "6:L1.H0.pv=fault(strength=1e30)")
            r = subprocess.run([REWIND, "bisect", "--cmd", shell, "--store", store, "--window", "6:9", "--fail", "nan"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 4, r.stdout + r.stderr[-3000:])  # 4: localized
            self.assertIn("failing set {L1.H0.pv}", r.stdout)

    def test_nanogpt(self):
        self.check()

    @needs_hf
    def test_hf_gpt2(self):
        self.check("--hf", "gpt2")


def train():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--hf", choices=["gpt2", "llama"])
    ap.add_argument("--plan-from", default="6:L1.H0.pv=fault(strength=8)", metavar="STEP:SPEC",
                    help="a plan on top from STEP on (a planted fault; strength=1e30 turns the loss NaN)")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(1337)
    model = hf_model(a.hf) if a.hf else GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rec = rewind.record(a.store, model, opt, checkpoint_every=4, checkpoint_wait=True, instrument=True,
                        plan_from={int(a.plan_from.split(":", 1)[0]): a.plan_from.split(":", 1)[1]})
    for _ in range(rec.start, a.steps):
        xy = rec.batch(lambda: batch(int(torch.randint(1 << 30, ()))))
        loss = run(model, xy=xy)[1]
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rec.step(loss=loss, grad_norm=norm)
    rec.close()


if __name__ == "__main__":
    if "--store" in sys.argv:
        train()
    else:
        unittest.main()
