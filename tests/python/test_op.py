"""rewind.op on the CPU: a block under torch.autocast(bfloat16) runs in FP32 where the plan
promotes it (L0.mlp=fp32, wildcards, the whole layer, all=fp32, head=fp32) and exactly as
written elsewhere: with no plan, or a plan that leaves it low, the output has the bits of the
block without rewind.op. Also the plan of a running rewind.record, the callable form's casts,
bad names, and the op names a recording stores (kv "ops")."""
import os
import sys
import tempfile
import unittest

import torch
import torch.nn as nn

import rewind

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def mlp_block():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
    x = torch.randn(4, 16, 32)
    return mlp, x


def bits(t):
    return t.detach().contiguous().view(-1).view(torch.int32 if t.dtype == torch.float32 else torch.int16)


class Op(unittest.TestCase):
    def setUp(self):
        self.mlp, self.x = mlp_block()

    def run_block(self, name=None, plan=None, backward=False):
        x = self.x.clone().requires_grad_(backward)
        self.mlp.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if name is None:
                y = self.mlp(x)
            else:
                with rewind.op(name, plan=plan):
                    y = self.mlp(x)
        if backward:
            y.float().square().sum().backward()
            return y.detach(), x.grad, self.mlp[0].weight.grad
        return y.detach()

    def test_no_plan_is_the_block_as_written(self):
        y0 = self.run_block()
        for plan in (None, "", "L1.mlp=fp32", "L0.H1.pv=fp32", "L0.qkv=fp32;L0.proj=fp32", "head=fp32"):
            y = self.run_block("L0.mlp", plan=plan)
            self.assertEqual(y.dtype, torch.bfloat16, plan)
            self.assertTrue(torch.equal(bits(y), bits(y0)), plan)

    def test_backward_without_plan_is_the_block_as_written(self):
        a = self.run_block(backward=True)
        b = self.run_block("L0.mlp", plan="L3.mlp=fp32", backward=True)
        for u, v in zip(a, b):
            self.assertTrue(torch.equal(bits(u), bits(v)))

    def test_promoted_block_runs_in_fp32(self):
        y0 = self.run_block()
        with torch.no_grad():
            y32 = self.mlp(self.x)  # the block in FP32, no autocast at all
        for plan in ("L0.mlp=fp32", "L*.mlp=fp32", "L0=fp32", "all=fp32", "L0.H{0,1}.pv=fp32;L0-2.mlp=fp32"):
            y = self.run_block("L0.mlp", plan=plan)
            self.assertEqual(y.dtype, torch.float32, plan)
            self.assertTrue(torch.equal(bits(y), bits(y32)), plan)
        # the promoted block's bits differ from the BF16 block's
        self.assertFalse(torch.equal(self.run_block("L0.mlp", plan="L0.mlp=fp32"), y0.float()))
        # a later `low` takes it back
        self.assertEqual(self.run_block("L0.mlp", plan="L*.mlp=fp32;L0.mlp=low").dtype, torch.bfloat16)

    def test_head_and_attention_linears(self):
        self.assertEqual(self.run_block("head", plan="head=fp32").dtype, torch.float32)
        self.assertEqual(self.run_block("head", plan="L0=fp32").dtype, torch.bfloat16)
        self.assertEqual(self.run_block("L2.attn", plan="L2.qkv=fp32").dtype, torch.bfloat16)
        self.assertEqual(self.run_block("L2.attn", plan="L2.qkv=fp32;L2.proj=fp32").dtype, torch.float32)
        self.assertEqual(self.run_block("L2.qkv", plan="L2.qkv=fp32").dtype, torch.float32)

    def test_callable_form_casts_inputs_and_output(self):
        xb = self.x.to(torch.bfloat16)
        mlp = self.mlp
        y = rewind.op("L0.mlp", plan="L0.mlp=fp32")(mlp, xb)
        with torch.no_grad():
            want = mlp(xb.float()).to(torch.bfloat16)
        self.assertEqual(y.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(bits(y), bits(want)))
        self.assertIs(rewind.op("L0.mlp", plan="")(lambda t: t, xb), xb)  # as written: no cast

    def test_a_bf16_input_under_the_context_form_says_how_to_cast(self):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.mlp[0](self.x)  # BF16
            with self.assertRaisesRegex(RuntimeError, r"rewind.op\('L0.mlp'\)\(fn, \*args\)"):
                with rewind.op("L0.mlp", plan="L0.mlp=fp32"):
                    self.mlp[2](h[..., :128])

    def test_bad_names_and_plans(self):
        for name in ("L0.mpl", "mlp", "L.mlp", "L0.H1.pv", "L99999.mlp"):
            with self.assertRaisesRegex(ValueError, "no op name"):
                rewind.op(name)
        with self.assertRaisesRegex(ValueError, "rewind.op: plan"):
            rewind.op("L0.mlp", plan="L0.mlp=sideways")

    def test_plan_of_the_running_recording_and_stored_names(self):
        model = nn.Sequential(nn.Linear(8, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.db")
            rec = rewind.record(path, model, opt, plan="L0.mlp=fp32")
            try:
                self.assertEqual(self.run_block("L0.mlp").dtype, torch.float32)
                self.assertEqual(self.run_block("L1.mlp").dtype, torch.bfloat16)
                x = rec.batch(lambda: torch.randn(2, 8))
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                rec.step(loss=loss)
            finally:
                rec.close()
                rewind._plan_state.set_active_plan("")  # the other tests give their plans
            ops = rewind.open(path).run().kv("ops")["ops"]
            for name in ("L0.mlp", "L1.mlp"):
                self.assertIn(name, ops)


if __name__ == "__main__":
    unittest.main()
