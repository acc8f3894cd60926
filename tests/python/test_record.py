"""rewind.record in a user's own loop (tiny_train.py, a 2-layer nanoGPT-like script): the store
it writes is a rewind store (rewind.open, `rewind store verify`), `rewind replay --cmd ...
--verify` replays a window bitwise from the recorded batches and generator states, a step
perturbed on replay is named, and a script that cannot replay the window gets one line and a
non-zero exit with the store untouched."""
import contextlib
import html
import io
import json
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

import torch

import rewind
from script_run import REWIND, RecordedRun, needs_rewind, script, sha


@needs_rewind
class RecordReplay(RecordedRun):
    def replay(self, cmd, *extra, window=("7", "14")):
        return self.rewind_cli("replay", "--cmd", cmd, "--store", self.store, "--from", window[0],
                               "--to", window[1], *extra)

    def test_store_reads_as_a_rewind_store(self):
        run = rewind.open(self.store).run()
        self.assertEqual(run.meta["kind"], "python")
        self.assertEqual(run.config["n_layer"], 2)
        s = run.steps()
        self.assertEqual(s["step"].tolist(), list(range(20)))
        self.assertTrue(all(d.startswith("d2:") for d in s["param_digest"]))
        self.assertEqual(len(set(s["param_digest"])), 20)  # the parameters change every step
        self.assertEqual(len(set(s["batch_hash"])), 20)
        self.assertTrue((s["loss"] > 0).all() and (s["grad_norm"] > 0).all())
        self.assertEqual(run.checkpoint_steps(), [0, 5, 10, 15])
        m = run.metrics()  # rec.step's lr and step time, rewind.attention's per-head monitors
        self.assertEqual(m["step"].tolist(), list(range(20)))
        self.assertTrue(np.array_equal(m["lr"], s["lr"]))
        for layer in (0, 1):
            for head in (0, 1):
                logit = m[f"L{layer}.H{head}.max_logit"]
                self.assertTrue(np.isfinite(logit).all() and (logit > 0).all() and len(set(logit)) > 1)
                self.assertTrue(((m[f"L{layer}.H{head}.repmax_rate"] >= 0) & (m[f"L{layer}.H{head}.repmax_rate"] <= 1)).all())
        self.assertNotIn("L2.H0.max_logit", m)
        ckpt = run.checkpoint(5)
        for name in ("model/wte.weight", "optimizer/state/0/exp_avg", "rng/cpu", "rng/state", "skeleton"):
            self.assertIn(name, ckpt)
        self.assertEqual(self.rewind_cli("store", "verify", self.store).returncode, 0)
        info = self.rewind_cli("store", "info", self.store)
        self.assertEqual(info.returncode, 0, info.stderr)
        self.assertIn("recorded by a Python script (rewind.record), one process", info.stdout)
        # The script's config has keys rewind train's lacks (nanoGPT's out_dir, dropout).
        page = os.path.join(self.dir, "run.html")
        view = self.rewind_cli("view", self.store, "-o", page)
        self.assertEqual(view.returncode, 0, view.stderr)
        with open(page) as f:
            self.assertIn("2 layers x 2 heads, width 32, sequence 16", f.read())
        log = self.rewind_cli("bisect", "log", "--store", self.store)
        self.assertEqual(log.returncode, 0, log.stderr)

    def test_trainer_commands_refuse_a_script_run_in_one_line(self):
        out = os.path.join(self.dir, "refused.pt")
        for args in (("step", "--store", self.store, "--step", "7", "--fp32", "L0.H0.pv"),
                     ("bisect", "--store", self.store, "--window", "5:9", "--fail", "nan"),
                     ("export", "nanogpt", "--store", self.store, "--step", "5", "-o", out)):
            r = self.rewind_cli(*args)
            self.assertEqual(r.returncode, 2, args[0] + ": " + r.stderr)
            self.assertIn("recorded by a Python script", r.stderr)
            self.assertIn("--cmd", r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertFalse(os.path.exists(out))

    def test_run_page_commands_paste_and_run(self):
        # The run page of a script's run offers its commands with the recorded --cmd: pasted into
        # a shell, its replay verifies bit for bit (and `rewind step`, which needs rewind's
        # trainer, is not offered).
        page = os.path.join(self.dir, "page.html")
        r = self.rewind_cli("view", self.store, "-o", page)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(page) as f:
            text = html.unescape(f.read())
        replays = [l for l in text.splitlines() if l.startswith("rewind replay --cmd ")]
        self.assertTrue(replays, text[-3000:])
        self.assertNotIn("rewind step --store", text)
        self.assertIn("rewind bisect --cmd ", text)
        line = replays[0].replace("rewind", shlex.quote(REWIND), 1)
        p = subprocess.run(line, shell=True, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, line + "\n" + p.stdout + p.stderr)
        self.assertIn("bitwise identical", p.stdout)

    def test_replay_verifies_bitwise(self):
        r = self.replay(script(self.store), "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("verified: every step from 5 to 14 is bitwise identical", r.stdout)

    def test_replay_feeds_the_recorded_batches(self):
        # Other data in the script: the batches come from the store, so the replay still verifies.
        r = self.replay(script(self.store, "--data-seed", "9"), "--verify", window=("10", "12"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("verified: every step from 10 to 12", r.stdout)

    def test_plan_and_fault_reach_the_script_through_the_environment(self):
        # REWIND_PLAN and REWIND_PLAN_FROM: no argument of the script's own carries them (a
        # spec's '=' and ';' would break a --key=value parser); the run records them, says so,
        # and replays bitwise without them set.
        store = os.path.join(self.dir, "env.db")
        cmd = script(store, "--steps", "8", "--no-config")
        env = {**os.environ, "REWIND_PLAN": "L1.H1.o=fp32", "REWIND_PLAN_FROM": "4:L0.H0.pv=fp32|6:L0.H1.o=fp32"}
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("rewind: recording with REWIND_PLAN='L1.H1.o=fp32' and REWIND_PLAN_FROM=", r.stderr)
        plan = rewind.open(store).run().plan
        self.assertEqual(plan["base"], "L1.H1.o=fp32")
        self.assertEqual(plan["changes"], [[4, "L0.H0.pv=fp32"], [6, "L0.H1.o=fp32"]])
        r = self.rewind_cli("replay", "--cmd", cmd, "--store", store, "--from", "5", "--to", "7", "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        bad = subprocess.run(script(os.path.join(self.dir, "bad_env.db"), "--steps", "2"), shell=True,
                             capture_output=True, text=True, env={**os.environ, "REWIND_PLAN_FROM": "x:L0.pv=fp32"})
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("REWIND_PLAN_FROM: expected STEP:SPEC", bad.stderr)

    def test_recorded_plan_applies_on_replay(self):
        # A run recorded under a plan (o in FP32 in one head: other bits than the default) replays
        # bitwise only if rewind.attention runs under that plan again.
        store = os.path.join(self.dir, "plan.db")
        cmd = script(store, "--steps", "8", "--plan", "L1.H1.o=fp32", "--no-config")
        self.assertEqual(subprocess.run(cmd, shell=True, capture_output=True).returncode, 0)
        self.assertEqual(rewind.open(store).run().plan, "L1.H1.o=fp32")
        losses = rewind.open(store).run().steps()["loss"]
        self.assertFalse(np.array_equal(losses, rewind.open(self.store).run().steps()["loss"][:8]))
        r = self.rewind_cli("replay", "--cmd", cmd, "--store", store, "--from", "5", "--to", "7", "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("verified: every step from 5 to 7", r.stdout)
        # Without a config the layers a plan may name come from the recorded monitors.
        r = self.rewind_cli("replay", "--cmd", cmd, "--store", store, "--from", "5", "--to", "7", "--plan", "L2.pv=fp32")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("layer 2 out of range (model has 2 layers", r.stderr)

    def test_state_objects_are_checkpointed_and_restored(self):
        # The lr comes from a LambdaLR passed as state=: a replay that restarted it would
        # report another lr at the first step after the checkpoint.
        store = os.path.join(self.dir, "sched.db")
        cmd = script(store, "--steps", "8", "--scheduler")
        self.assertEqual(subprocess.run(cmd, shell=True, capture_output=True).returncode, 0)
        skeleton = pickle.loads(rewind.open(store).run().checkpoint(5)["skeleton"].numpy().tobytes())
        self.assertEqual(skeleton["state"]["sched"]["last_epoch"], 5)  # no tensors: all in the skeleton
        r = self.rewind_cli("replay", "--cmd", cmd, "--store", store, "--from", "6", "--to", "7", "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("verified: every step from 5 to 7", r.stdout)
        r = self.rewind_cli("replay", "--cmd", script(store, "--steps", "8"), "--store", store, "--from", "6",
                            "--to", "7", "--verify")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("state= names [] here, ['sched'] in the recording", r.stderr.strip().splitlines()[-1])

    def test_perturbed_step_is_named(self):
        r = self.replay(script(self.store, "--perturb", "10"), "--verify")
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("replay diverged at step 10: parameter digest recorded d2:", r.stderr)

    def test_plan_changes_the_window_only(self):
        out = os.path.join(self.dir, "curve.json")
        r = self.replay(script(self.store), "--verify", "--plan", "L*.attn=fp32", "--json", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("differs from the recording", r.stdout)
        with open(out) as f:
            steps = {s["step"]: s for s in json.load(f)["steps"]}
        self.assertEqual(sorted(steps), list(range(5, 15)))
        for s in (5, 6):  # before the window: the recorded plan, verified bitwise
            self.assertEqual(steps[s]["loss"], steps[s]["recorded_loss"])
        # The window's first step runs the plan: its backward (the gradient norm) differs. FP32
        # attention moves this model's FP32 loss by a few ulps only (4 at step 0), which under
        # torch 2.15's CPU kernels round to none at step 7 (16 under Debian's 1.13): the loss
        # is required to differ somewhere in the window, not at its first step.
        self.assertNotEqual(steps[7]["grad_norm"], steps[7]["recorded_grad_norm"])
        self.assertTrue(any(steps[s]["loss"] != steps[s]["recorded_loss"] for s in range(7, 15)), steps)

    def test_a_resumed_loop_keeps_its_step_numbers(self):
        # rewind.record(start=7): steps 7.., a checkpoint at the first step although the
        # schedule (every 5) has none there, and replays of that numbering.
        store = os.path.join(self.dir, "resumed.db")
        cmd = script(store, "--steps", "16", "--start", "7")
        self.assertEqual(subprocess.run(cmd, shell=True, capture_output=True).returncode, 0)
        run = rewind.open(store).run()
        self.assertEqual(run.steps()["step"].tolist(), list(range(7, 16)))
        self.assertEqual(run.checkpoint_steps(), [7, 10, 15])
        r = self.rewind_cli("replay", "--cmd", cmd, "--store", store, "--from", "8", "--to", "12", "--verify")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("verified: every step from 7 to 12", r.stdout)

    def test_sampled_monitors_are_recorded_as_such_and_replays_verify(self):
        # monitor_every=4: per-head monitors on steps 0, 4, 8, ... only, the choice in the run's meta;
        # the losses are the every-step recording's, and replay --verify passes.
        store = os.path.join(self.dir, "sampled.db")
        cmd = script(store, "--steps", "20", "--monitor-every", "4")
        self.assertEqual(subprocess.run(cmd, shell=True, capture_output=True).returncode, 0)
        run = rewind.open(store).run()
        self.assertEqual(run.meta["monitor_every"], 4)
        m = run.metrics(prefix="L0.H0.max_logit")
        self.assertEqual(m["step"].tolist(), [0, 4, 8, 12, 16])
        every = rewind.open(self.store).run()
        self.assertEqual(run.steps()["loss"].tolist(), every.steps()["loss"].tolist())
        r = self.rewind_cli("replay", "--cmd", cmd, "--store", store, "--from", "2", "--to", "9", "--verify")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        bad = subprocess.run(script(os.path.join(self.dir, "bad.db"), "--monitor-every", "0"), shell=True,
                             capture_output=True, text=True)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("monitor_every must be at least 1", bad.stderr)

    def test_script_checkpoint_is_the_scripts_state(self):
        run = rewind.open(self.store).run()
        ck = run.script_checkpoint(5)
        self.assertEqual(ck["step"], 5)
        self.assertIn("wte.weight", ck["model"])
        self.assertEqual(sorted(ck["optimizer"]), ["param_groups", "state"])
        self.assertEqual(len(ck["optimizer"]["state"]), len(ck["optimizer"]["param_groups"][0]["params"]))
        out = os.path.join(self.dir, "ckpt.pt")
        with self.assertRaisesRegex(ValueError, "no transformer.wte.weight: not nanoGPT's GPT"):
            run.export_nanogpt(5, out)  # tiny_train's GPT has its own names
        self.assertFalse(os.path.exists(out))

    def test_killed_recording_leaves_a_store_that_verifies_and_replays(self):
        store = os.path.join(self.dir, "killed.db")
        p = subprocess.Popen(script(store, "--steps", "400", "--checkpoint-every", "3"), shell=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and p.poll() is None:
                time.sleep(0.2)
                try:
                    run = rewind.open(store).run()  # checkpoints 0, 3, 6 and steps past 10
                    if len(run.steps()["step"]) >= 12 and len(run.checkpoint_steps()) >= 3:
                        break
                except (ValueError, IndexError):  # not created yet, or no run yet
                    pass
            self.assertIsNone(p.poll(), p.stderr.read() if p.poll() is not None else "")
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        self.assertEqual(self.rewind_cli("store", "verify", store).returncode, 0)
        run = rewind.open(store).run()
        last = int(run.steps()["step"][-1])
        self.assertGreaterEqual(last, 11)
        self.assertEqual(run.checkpoint_steps()[:3], [0, 3, 6])
        r = self.rewind_cli("replay", "--cmd", script(store, "--steps", "400", "--checkpoint-every", "3"),
                            "--store", store, "--from", "7", "--to", "10", "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("verified: every step from 6 to 10", r.stdout)

    def test_bad_input_is_one_line_and_leaves_the_store(self):
        before = sha(self.store)
        cases = [
            (self.rewind_cli("replay", "--store", self.store, "--from", "7", "--to", "14"),
             2, "recorded by a Python script (rewind.record); replay it with --cmd"),
            (self.replay(f"{shlex.quote(sys.executable)} -c pass"), 2,
             "the script exited with status 0 without calling rewind.record"),
            (self.replay(script(self.store, "--steps", "10")), 2,
             "exited with status 0 after step 9, before step 14"),
            (self.replay(script(self.store, "--n-embd", "48")), 2,
             "the model's parameter 'wte.weight' is [64, 48] float32 here, [64, 32] float32 in the recording"),
            (self.replay(script(self.store), window=("7", "40")), 2, "is outside the recording (steps 0..19)"),
            (self.replay(script(self.store), "--plan", "L5.H0.pv=fp32"), 2, "layer 5 out of range (model has 2 layers"),
        ]
        for r, code, text in cases:
            self.assert_one_line(r, code, text)
        again = subprocess.run(script(self.store, "--steps", "2"), shell=True, capture_output=True, text=True)
        self.assertNotEqual(again.returncode, 0)  # never records over a store
        self.assertIn("RewindError", again.stderr)
        self.assertEqual(sha(self.store), before)


class Digest(unittest.TestCase):
    def test_tensor_path_matches_the_host_loop(self):
        # The tensor-op digest (what a GPU's parameters take) against the plain loop over words,
        # on tensors past one 4M-word slice, BF16 ones, a scalar, and words with the top bit set.
        g = torch.Generator().manual_seed(0)
        ts = [torch.randn(3, 5, generator=g), torch.randn(4100, 1100, generator=g),
              torch.randn(6, 4, generator=g).bfloat16(), torch.tensor(-2.5), -torch.rand(7, generator=g)]
        want = rewind._C.param_digest(ts)
        self.assertEqual(rewind._C.param_digest(ts, tensor_path=True), want)
        self.assertRegex(want, "^d2:[0-9a-f]{16}$")
        ts[1][4000, 1000] = torch.nextafter(ts[1][4000, 1000], torch.tensor(9.0))  # one bit, second slice
        self.assertNotEqual(rewind._C.param_digest(ts, tensor_path=True), want)
        self.assertEqual(rewind._C.param_digest(ts, tensor_path=True), rewind._C.param_digest(ts))
        with self.assertRaises(rewind.RewindError):  # 3 BF16 values: not whole 32-bit words
            rewind._C.param_digest([torch.zeros(3, dtype=torch.bfloat16)])


class SlowHeadNote(unittest.TestCase):
    def test_said_for_an_unaligned_head_under_deterministic_algorithms_only(self):
        from rewind._recording import slow_head_note

        class LM(torch.nn.Module):
            def __init__(self, vocab):
                super().__init__()
                self.body = torch.nn.Linear(8, 16)
                self.lm_head = torch.nn.Linear(16, vocab, bias=False)

        torch.use_deterministic_algorithms(True)
        try:
            note = slow_head_note(LM(50257), devices=("cpu",))
            self.assertIn("50257 outputs, not a multiple of 8", note)
            self.assertNotIn("\n", note)
            self.assertIsNone(slow_head_note(LM(50304), devices=("cpu",)))   # aligned
            self.assertIsNone(slow_head_note(LM(50257)))                      # not on a GPU
            plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 11))
            self.assertIn("11 outputs", slow_head_note(plain, devices=("cpu",)))  # the last linear
        finally:
            torch.use_deterministic_algorithms(False)
        self.assertIsNone(slow_head_note(LM(50257), devices=("cpu",)))      # nondeterministic: no note


class InProcess(unittest.TestCase):
    """The REWIND_REPLAY protocol without the CLI: a loop whose get_batch returns a dict, recorded
    and then replayed in this process from the checkpoint at step 3."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="rewind_inproc_")

    def tearDown(self):
        os.environ.pop(rewind._recording.REPLAY_ENV, None)
        os.environ.pop("REWIND_DOCTOR", None)
        rewind._recording._replaying = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def loop(self, rec, get_batch, last, seen, first=None):
        model, opt = rec.model, rec.optimizer
        for it in range(rec.start if first is None else first, last + 1):
            b = rec.batch(get_batch)
            seen[it] = {k: v.clone() for k, v in b.items()}
            loss = torch.nn.functional.cross_entropy(model(b["x"]), b["y"])
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.step(loss=loss, lr=0.1)

    def make(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3))
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def test_dict_batches_replay_without_calling_get_batch(self):
        store, report = os.path.join(self.dir, "run.db"), os.path.join(self.dir, "report.jsonl")
        model, opt = self.make()
        rec = rewind.record(store, model, opt, checkpoint_every=3, checkpoint_wait=True)
        self.assertIs(rec.mode, rewind.Mode.RECORD)
        recorded, replayed = {}, {}
        self.loop(rec, lambda: {"x": torch.randn(2, 4), "y": torch.randint(3, (2,))}, 5, recorded)
        rec.close()
        os.environ[rewind._recording.REPLAY_ENV] = json.dumps(
            {"store": store, "run": 0, "from": 4, "to": 5, "plan": "", "report": report})
        model, opt = self.make()
        rec = rewind.record("ignored.db", model, opt, checkpoint_every=3)
        self.assertIs(rec.mode, rewind.Mode.REPLAY)
        self.assertEqual(rec.start, 3)

        def not_called():
            raise AssertionError("get_batch called during a replay")
        with self.assertRaises(rewind.WindowDone) as done:  # a SystemExit: the script ends with status 0
            self.loop(rec, not_called, 99, replayed)
        self.assertEqual((done.exception.code, done.exception.mode, done.exception.last_step),
                         (0, rewind.Mode.REPLAY, 5))
        with self.assertRaises(rewind.WindowDone):  # the window has no more steps
            rec.batch(not_called)
        with self.assertRaises(rewind.WindowDone):
            rec.step(loss=0.0)
        self.assertEqual(sorted(replayed), [3, 4, 5])
        for it, b in replayed.items():
            self.assertEqual(list(b), ["x", "y"])
            self.assertTrue(all(torch.equal(b[k], recorded[it][k]) for k in b))
        with open(report) as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual(lines[0], {"start": 3, "run": 1})
        self.assertEqual(lines[-1], {"done": 5})
        want = rewind.open(store).run().steps()
        got = [line for line in lines if "step" in line]
        self.assertEqual([g["step"] for g in got], [3, 4, 5])
        for g in got:
            self.assertEqual(g["digest"], want["param_digest"][g["step"]])
            self.assertEqual(np.float32(g["loss"]), want["loss"][g["step"]])
        run = rewind.open(store).run()  # the recorded batches read back
        for it in range(6):
            b = run.batch(it)
            self.assertTrue(list(b) == ["x", "y"] and all(torch.equal(b[k], recorded[it][k]) for k in b))
        with self.assertRaises(KeyError):
            run.batch(6)
        with self.assertRaises(rewind.RewindError):  # one recorder per replaying process
            rewind.record("ignored.db", model, opt)

    def test_the_mode_is_read_once_when_the_recorder_is_made(self):
        store = os.path.join(self.dir, "run.db")
        model, opt = self.make()
        rec = rewind.record(store, model, opt, checkpoint_every=2)
        seen = {}
        self.loop(rec, lambda: {"x": torch.randn(2, 4), "y": torch.randint(3, (2,))}, 1, seen)
        # The environment changing under a running loop does not turn it into a replay.
        os.environ[rewind._recording.REPLAY_ENV] = json.dumps(
            {"store": store, "run": 0, "from": 0, "to": 1, "plan": "", "report": os.devnull})
        self.loop(rec, lambda: {"x": torch.randn(2, 4), "y": torch.randint(3, (2,))}, 3, seen, first=2)
        self.assertIs(rec.mode, rewind.Mode.RECORD)
        rec.close()
        self.assertEqual(rewind.open(store).run().steps()["step"].tolist(), [0, 1, 2, 3])

    def test_doctor_window_ends_with_window_done_and_records_nothing(self):
        store, report = os.path.join(self.dir, "never.db"), os.path.join(self.dir, "doctor.jsonl")
        os.environ["REWIND_DOCTOR"] = json.dumps({"steps": 2, "report": report})
        model, opt = self.make()
        rec = rewind.record(store, model, opt)
        self.assertIs(rec.mode, rewind.Mode.DOCTOR)
        seen = {}
        with self.assertRaises(rewind.WindowDone) as done:
            self.loop(rec, lambda: {"x": torch.randn(2, 4), "y": torch.randint(3, (2,))}, 99, seen)
        self.assertEqual((done.exception.code, done.exception.mode, done.exception.last_step),
                         (0, rewind.Mode.DOCTOR, 1))
        self.assertEqual(sorted(seen), [0, 1])
        rec.close()  # nothing to close
        self.assertFalse(os.path.exists(store))
        with open(report) as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual(lines[-1], {"done": 1})
        self.assertEqual({line["step"] for line in lines if line.get("what") == "loss"}, {0, 1})

    def test_a_busy_writer_defers_a_checkpoint_instead_of_stopping_the_loop(self):
        # A checkpoint every step of a loop whose steps are far shorter than a checkpoint's
        # write: the ones due while the writer is busy are taken at a later step, each holding
        # the state before the step it is stored at.
        store = os.path.join(self.dir, "run.db")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        rec = rewind.record(store, model, opt, checkpoint_every=1)
        before = {}
        for it in range(40):
            before[it] = model[0].weight.detach().clone()
            b = rec.batch(lambda: {"x": torch.randn(2, 256), "y": torch.randint(3, (2,))})
            loss = torch.nn.functional.cross_entropy(model(b["x"]), b["y"])
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.step(loss=loss)
        late, folded, max_late, pending = rec._rec.checkpoint_lateness()
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            rec.close()
            rec.close()  # once
        self.assertEqual(said.getvalue().count("\n"), 1)
        # Taken late, or (a loop that outran the writer only at its end) one left untaken.
        self.assertTrue(late > 0 or pending >= 0)
        if late:
            self.assertIn(f"{late} checkpoint(s) taken late, by up to {max_late} step(s)", said.getvalue())
            self.assertGreaterEqual(max_late, 1)
        if pending >= 0:
            self.assertIn(f"the checkpoint due at step {pending} was not taken", said.getvalue())
        run = rewind.open(store).run()
        steps = run.checkpoint_steps()
        self.assertEqual(steps[0], 0)
        self.assertLess(len(steps), 40)  # 3 MB of state a step: the writer cannot keep up
        # Each due step taken, folded into a late one, or the one left untaken.
        self.assertLessEqual(len(steps) + folded + (pending >= 0), 40)
        self.assertTrue(all(a < b for a, b in zip(steps, steps[1:])) and steps[-1] < 40)
        for c in steps:
            self.assertTrue(torch.equal(run.checkpoint(c)["model/0.weight"], before[c]), c)
        if os.path.exists(REWIND):
            self.assertEqual(subprocess.run([REWIND, "store", "verify", store], capture_output=True).returncode, 0)


if __name__ == "__main__":
    unittest.main()
