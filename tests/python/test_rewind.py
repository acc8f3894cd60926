"""The `rewind` Python package under Debian's python3 + torch: rewind.attention against a
float64 reference (forward and backward, per-head and per-layer flags, determinism) and
rewind.open on a store recorded by the rewind binary (REWIND_BIN)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

import rewind


def reference(q, k, v, causal=True):
    q, k, v = (x.double() for x in (q, k, v))
    s = (q @ k.transpose(-2, -1)) / q.size(-1) ** 0.5
    if causal:
        t = s.size(-1)
        s = s.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class Attention(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(0)
        self.q, self.k, self.v = (torch.randn(2, 3, 70, 16, generator=g) for _ in range(3))
        self.do = torch.randn(2, 3, 70, 16, generator=g)

    def run_op(self, plan="", layer=0):
        q, k, v = (x.clone().requires_grad_() for x in (self.q, self.k, self.v))
        o = rewind.attention(q, k, v, plan=plan, layer=layer)
        o.backward(self.do)
        return o.detach(), q.grad, k.grad, v.grad

    def test_fp32_plan_matches_reference_forward_and_backward(self):
        o, dq, dk, dv = self.run_op("L0.attn=fp32")
        q, k, v = (x.double().requires_grad_() for x in (self.q, self.k, self.v))
        ref = reference(q, k, v)
        ref.backward(self.do.double())
        torch.testing.assert_close(o.double(), ref.detach(), rtol=1e-5, atol=1e-5)
        for got, want in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)

    def test_default_plan_rounds_like_bf16(self):
        o = self.run_op()[0]
        self.assertTrue(torch.equal(o, o.bfloat16().float()))  # O is BF16-valued
        torch.testing.assert_close(o.double(), reference(self.q, self.k, self.v), rtol=0, atol=3e-2)
        self.assertFalse(torch.equal(o, self.run_op("L0.attn=fp32")[0]))

    def test_flags_apply_per_head_and_per_layer(self):
        base = self.run_op()[0]
        head1 = self.run_op("L0.H1.o=fp32")[0]
        self.assertTrue(torch.equal(head1[:, [0, 2]], base[:, [0, 2]]))
        self.assertFalse(torch.equal(head1[:, 1], base[:, 1]))
        self.assertTrue(torch.equal(self.run_op("L1.H1.o=fp32", layer=0)[0], base))
        self.assertTrue(torch.equal(self.run_op("L1.H1.o=fp32", layer=1)[0], head1))

    def test_deterministic(self):
        a, b = self.run_op("L*.H*.softmax=stable(beta=2)"), self.run_op("L*.H*.softmax=stable(beta=2)")
        for x, y in zip(a, b):
            self.assertTrue(torch.equal(x, y))

    def test_stochastic_rounding_draws_the_bits_of_its_step(self):
        """pv=sr's bits are a function of the step rewind.record started (set_sr_step) and the
        layer: the same step twice gives the same bits, another step or layer others, and the
        heads without sr do not change."""
        plan = "L0.H1.pv=sr;L1.H1.pv=sr"
        try:
            rewind._C.set_sr_step(7)
            a = self.run_op(plan)
            again = self.run_op(plan)
            other_layer = self.run_op(plan, layer=1)
            rewind._C.set_sr_step(8)
            b = self.run_op(plan)
        finally:
            rewind._C.set_sr_step(0)
        self.assertTrue(all(torch.equal(x, y) for x, y in zip(a, again)))
        self.assertFalse(torch.equal(a[0][:, 1], b[0][:, 1]))
        self.assertFalse(torch.equal(a[0][:, 1], other_layer[0][:, 1]))
        self.assertTrue(torch.equal(a[0][:, [0, 2]], b[0][:, [0, 2]]))
        self.assertFalse(torch.equal(a[0], self.run_op()[0]))

    def test_bf16_inputs_take_the_bf16_kernels_with_the_bits_of_the_fp32_path(self):
        # BF16 q, k, v (a model under autocast) go to the kernels' BF16 entry points unless a
        # head of the layer promotes an op; REWIND_ATTENTION_FP32_PATH forces the FP32 path.
        def run(plan, fp32_path, layer=1):
            if fp32_path:
                os.environ["REWIND_ATTENTION_FP32_PATH"] = "1"
            try:
                rewind._C.set_monitoring(True)
                rewind._C.collect_monitors()
                q, k, v = (x.bfloat16().requires_grad_() for x in (self.q, self.k, self.v))
                o = rewind.attention(q, k, v, plan=plan, layer=layer)
                fast = "Bf16Attention" in o.grad_fn.name()
                self.assertEqual(fast, not fp32_path and "fp32" not in plan, plan)
                o.backward(self.do.bfloat16())
                stats = rewind._C.collect_monitors()  # [("L1.H0.max_logit", value), ...]
                return [o.detach(), q.grad, k.grad, v.grad], stats
            finally:
                rewind._C.set_monitoring(False)
                os.environ.pop("REWIND_ATTENTION_FP32_PATH", None)
        for plan in ("", "L1.H*.softmax=stable(beta=2)", "L1.H2.pv=fault(strength=25600)", "L1.H0.pv=fp32"):
            (fast, fast_stats), (slow, slow_stats) = run(plan, False), run(plan, True)
            for x, y in zip(fast, slow):
                self.assertEqual(x.dtype, torch.bfloat16)
                self.assertTrue(torch.equal(x, y), plan)
            self.assertEqual(fast_stats, slow_stats, plan)
            self.assertTrue(fast_stats, plan)

    def test_the_views_models_pass_give_the_bits_of_dense_inputs(self):
        # q, k, v as nanoGPT / GPT-2 pass them (views of one fused projection) and as Llama does
        # (each a transposed (B, T, H, D)) take our layout copies on a GPU: the same O and
        # gradients as dense inputs, and dQ, dK, dV laid out as the fused projection's gradient.
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        b, h, t, d = 2, 3, 70, 64  # a head dim the CUDA kernels have
        g = torch.Generator().manual_seed(3)
        x = torch.randn(b, t, 3 * h * d, generator=g).bfloat16().to(dev)
        do = torch.randn(b, h, t, d, generator=g).bfloat16().to(dev)

        def run(make):
            leaf = x.clone().requires_grad_()
            q, k, v = make(leaf)
            o = rewind.attention(q, k, v, plan="", layer=0)
            self.assertIn("Bf16Attention", o.grad_fn.name())
            o.backward(do)
            return o.detach(), leaf.grad

        def fused(leaf):
            return (z.view(b, t, h, d).transpose(1, 2) for z in leaf.split(h * d, dim=2))

        def separate(leaf):
            return (z.contiguous().view(b, t, h, d).transpose(1, 2) for z in leaf.split(h * d, dim=2))

        def dense(leaf):
            return (z.view(b, t, h, d).transpose(1, 2).contiguous() for z in leaf.split(h * d, dim=2))

        want = run(dense)
        for make in (fused, separate):
            got = run(make)
            for x_got, x_want in zip(got, want):
                self.assertTrue(torch.equal(x_got, x_want), make.__name__)
        q, k, v = dense(x.clone().requires_grad_())
        strides = []
        q.register_hook(lambda grad: strides.append(grad.stride()))
        rewind.attention(q, k, v).backward(do)
        self.assertEqual(strides, [(t * 3 * h * d, d, 3 * h * d, 1)])  # a view of (B, T, 3, H, D)

    def test_dtype_and_errors(self):
        o = rewind.attention(self.q.bfloat16(), self.k.bfloat16(), self.v.bfloat16())
        self.assertEqual(o.dtype, torch.bfloat16)
        with self.assertRaises(ValueError):
            rewind.attention(self.q, self.k, self.v, plan="L0.H9.pv=fp32")
        with self.assertRaises(RuntimeError):
            rewind.attention(self.q[0], self.k[0], self.v[0])
        # Attention dropout is refused in one line, never dropped silently; 0 is the plain op.
        with self.assertRaises(rewind.RewindError) as e:
            rewind.attention(self.q, self.k, self.v, dropout_p=0.1)
        self.assertIn("dropout_p=0.1 is not supported", str(e.exception))
        self.assertNotIn("\n", str(e.exception))
        self.assertTrue(torch.equal(rewind.attention(self.q, self.k, self.v, dropout_p=0.0),
                                    rewind.attention(self.q, self.k, self.v)))


class StoreRead(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="rewind_py_")
        cls.db = os.path.join(cls.dir, "run.db")
        data = os.path.join(cls.dir, "train.bin")
        binary = os.environ["REWIND_BIN"]
        subprocess.run([binary, "data", "synth", "-o", data, "--tokens", "20000", "--vocab", "64"],
                       check=True, capture_output=True)
        out = subprocess.run([binary, "train", "--data", data, "--steps", "6", "--vocab-size", "64",
                              "--record", cls.db, "--checkpoint-every", "3",
                              "--capture", "steps=2:2;L0.H1"], check=True, capture_output=True, text=True)
        cls.printed = [float(x) for x in re.findall(r"\| loss ([0-9.]+) \|", out.stdout)]
        bis = subprocess.run([binary, "bisect", "--store", cls.db, "--window", "1:4", "--fail", "nan", "--quiet"],
                             capture_output=True, text=True)
        assert bis.returncode == 0, bis.stdout + bis.stderr
        cls.store = rewind.open(cls.db)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def test_runs_and_config(self):
        self.assertEqual(len(self.store.runs), 1)
        run = self.store.run()
        self.assertEqual(run.config["vocab_size"], 64)
        self.assertEqual(run.meta["threads"], 1)

    def test_steps_are_the_recorded_values(self):
        s = self.store.run().steps()
        np.testing.assert_array_equal(s["step"], np.arange(6))
        self.assertEqual(s["loss"].dtype, np.float32)
        np.testing.assert_allclose(s["loss"], self.printed, atol=1e-6)
        self.assertTrue(all(d.startswith("d2:") for d in s["param_digest"]))

    def test_metrics(self):
        m = self.store.run().metrics(prefix="L1.H3.")
        self.assertIn("L1.H3.max_logit", m)
        self.assertEqual(len(m["L1.H3.max_logit"]), len(m["step"]))

    def test_checkpoints_and_tensors(self):
        run = self.store.run()
        self.assertEqual(run.checkpoint_steps(), [0, 3, 6])
        ck = run.checkpoint(3)
        self.assertEqual(tuple(ck["param/wte"].shape), (64, 64))
        self.assertEqual(ck["param/wte"].dtype, torch.float32)
        self.assertEqual(int(ck["step"]), 3)
        names = {(t["name"], t["layer"], t["head"]) for t in run.tensors() if t["step"] == 2}
        self.assertIn(("q", 0, 1), names)
        q = run.tensor("q", 2, layer=0, head=1)
        self.assertEqual(q.dim(), 3)

    def test_bisect_reports(self):
        reports = self.store.run().bisect_reports()
        self.assertEqual(len(reports), 1)
        job = next(iter(reports.values()))
        self.assertIn("verdict", job)
        self.assertIsInstance(job["log"], list)
        self.assertTrue(self.store.probes())

    def test_frames_with_pandas_and_how_to_get_it_without(self):
        try:
            import pandas  # noqa: F401
        except ImportError:
            with self.assertRaisesRegex(ImportError, r"pip install pandas .*apt-get install python3-pandas"):
                self.store.run().steps(as_frame=True)
            return
        self.assertEqual(len(self.store.run().steps(as_frame=True)), 6)

    def test_offsets_give_the_recorded_batch(self):
        run = self.store.run()
        s = run.steps()
        c = run.config
        self.assertEqual(s["offsets"][2].shape, (c["gradient_accumulation_steps"], c["batch_size"]))
        x, y = run.batch(2)
        self.assertEqual(tuple(x.shape), (c["gradient_accumulation_steps"], c["batch_size"], c["block_size"]))
        self.assertTrue(torch.equal(x[..., 1:], y[..., :-1]))
        # The recorded batch hash (FNV-1a over each row's block_size + 1 tokens, then over the
        # micro-batches' hashes) of the tokens at those offsets.
        def fnv(data, h=0xcbf29ce484222325):
            for b in data:
                h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
            return h
        step = 0xcbf29ce484222325
        for m in range(x.shape[0]):
            h = 0xcbf29ce484222325
            for row in range(x.shape[1]):
                h = fnv(torch.cat([x[m, row], y[m, row, -1:]]).numpy().astype("<u2").tobytes(), h)
            step = fnv(h.to_bytes(8, "little"), step)
        self.assertEqual(f"{step:016x}", s["batch_hash"][2])
        with self.assertRaises(KeyError):
            run.batch(99)

    def test_checkpoint_in_nanogpt_names_loads_into_nanogpt(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
        from nanogpt_fixture import GPT  # nanoGPT's model.py names and math
        run = self.store.run()
        sd = run.checkpoint(3, names="nanogpt")
        ours = run.checkpoint(3)
        self.assertTrue(torch.equal(sd["transformer.h.1.attn.c_attn.weight"], ours["param/h.1.c_attn"]))
        self.assertTrue(torch.equal(sd["lm_head.weight"], ours["param/wte"]))
        c = run.config
        model = GPT(dict(c, bias=c.get("bias", False), dropout=0.0))
        model.load_state_dict(sd, strict=True)
        x, y = run.batch(3)
        with torch.no_grad():
            loss = model(x[0], y[0]).item()  # FP32, against the recorded BF16 step
        self.assertAlmostEqual(loss, float(run.steps()["loss"][3]), delta=0.02 * loss)
        with self.assertRaises(ValueError):
            run.checkpoint(3, names="hf")

    def test_not_a_store(self):
        path = os.path.join(self.dir, "junk")
        with open(path, "w") as f:
            f.write("junk")
        with self.assertRaises(ValueError):
            rewind.open(path)


class PublicApi(unittest.TestCase):
    """What `import rewind` offers: the names of rewind.__all__, whose options are keyword-only;
    the modules behind them are private, and the exception that ends a replayed window is a
    named, catchable SystemExit of code 0."""

    PUBLIC = {"attention", "op", "instrument", "uninstrument", "instrumented", "record", "Recorder", "Mode",
              "WindowDone", "active_plan", "open", "Store", "Run", "RewindError"}
    # Modules that were once importable by these names; rewind's own plumbing and implementation.
    FORMER_MODULES = ("serve", "doctor", "ranks", "batches", "compiled", "recording", "store", "instrument", "ops")

    def test_all_is_the_public_api_and_every_module_is_private(self):
        import importlib.util
        import inspect
        import pkgutil
        self.assertEqual(set(rewind.__all__), self.PUBLIC)
        for name in rewind.__all__:
            self.assertIsNotNone(getattr(rewind, name, None), name)
        for info in pkgutil.iter_modules(rewind.__path__):
            self.assertTrue(info.name.startswith("_"), f"rewind.{info.name} is a public module")
        for name in dir(rewind):
            obj = getattr(rewind, name)
            if not name.startswith("_") and inspect.ismodule(obj):
                self.assertFalse(obj.__name__.startswith("rewind"), f"rewind.{name} is the module {obj.__name__}")
        for old in self.FORMER_MODULES:
            self.assertFalse(inspect.ismodule(getattr(rewind, old, None)), old)
            self.assertIsNone(importlib.util.find_spec(f"rewind.{old}"), f"rewind.{old} is still a module")
        for cls in (rewind.Recorder, rewind.Store, rewind.Run, rewind.Mode, rewind.WindowDone):
            self.assertEqual(cls.__module__, "rewind")

    def test_options_are_keyword_only(self):
        import inspect
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for fn, names in ((rewind.record, ["path", "model", "optimizer"]),
                          (rewind.Recorder, ["path", "model", "optimizer"]),
                          (rewind.Recorder.step, ["self", "loss"]),
                          (rewind.attention, ["q", "k", "v"]),
                          (rewind.op, ["name"]),
                          (rewind.instrument, ["model"]),
                          (rewind.Run.steps, ["self"]),
                          (rewind.Run.batch, ["self", "step"]),
                          (rewind.Run.metrics, ["self", "prefix"]),
                          (rewind.Run.checkpoint, ["self", "step"]),
                          (rewind.Run.tensor, ["self", "name", "step"])):
            got = [p.name for p in inspect.signature(fn).parameters.values() if p.kind in positional]
            self.assertEqual(got, names, fn.__qualname__)
            self.assertTrue(fn.__doc__, fn.__qualname__)
        q = torch.randn(1, 2, 4, 8)
        with self.assertRaises(TypeError):
            rewind.attention(q, q, q, "L0.H0.pv=fp32")
        with self.assertRaises(TypeError):
            rewind.op("L0.mlp", "L0.mlp=fp32")
        with self.assertRaises(TypeError):
            rewind.instrument(torch.nn.Linear(2, 2), "L0.mlp=fp32")
        d = tempfile.mkdtemp(prefix="rewind_api_")
        try:
            model = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            path = os.path.join(d, "run.db")
            with self.assertRaises(TypeError):
                rewind.record(path, model, opt, 5)
            with self.assertRaises(TypeError):  # a misspelt option, before anything is made
                rewind.record(path, model, opt, checkpoint_evry=5)
            self.assertFalse(os.path.exists(path))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_window_done_ends_a_script_with_status_0_and_no_traceback(self):
        import pickle
        done = rewind.WindowDone(rewind.Mode.REPLAY, 14)
        self.assertIsInstance(done, SystemExit)
        self.assertNotIsInstance(done, Exception)  # `except Exception` in a loop lets it through
        self.assertEqual((done.code, done.mode, done.last_step), (0, rewind.Mode.REPLAY, 14))
        self.assertIn("step 14", str(done))
        again = pickle.loads(pickle.dumps(done))
        self.assertEqual((type(again), again.code, again.mode, again.last_step),
                         (rewind.WindowDone, 0, rewind.Mode.REPLAY, 14))
        r = subprocess.run([sys.executable, "-c", "import rewind\n"
                            "try:\n    raise rewind.WindowDone(rewind.Mode.DOCTOR, 1)\n"
                            "except Exception:\n    print('caught')\n"],
                           capture_output=True, text=True, env=dict(os.environ))
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))

    def test_the_mode_comes_from_the_environment_rewind_sets(self):
        from rewind._mode import Launch
        self.assertEqual(Launch.from_environ({}).mode, rewind.Mode.RECORD)
        replay = Launch.from_environ({"REWIND_REPLAY": '{"from": 3, "to": 5}'})
        self.assertEqual((replay.mode, dict(replay.spec)), (rewind.Mode.REPLAY, {"from": 3, "to": 5}))
        both = {"REWIND_REPLAY": "{}", "REWIND_DOCTOR": '{"steps": 2}'}
        self.assertEqual(Launch.from_environ(both).mode, rewind.Mode.DOCTOR)
        with self.assertRaises(Exception):  # frozen: decided once
            replay.mode = rewind.Mode.RECORD
        for bad in ("not json", "[1, 2]"):
            with self.assertRaises(rewind.RewindError) as e:
                Launch.from_environ({"REWIND_REPLAY": bad})
            self.assertIn("REWIND_REPLAY is set but is not the JSON object", str(e.exception))
            self.assertNotIn("\n", str(e.exception))


if __name__ == "__main__":
    unittest.main()
