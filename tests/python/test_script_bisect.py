"""`rewind bisect --cmd` over a run recorded by tiny_train.py: a fault planted through the plan in
one head's pv from step 20 (rewind.record's plan_from) is localized exactly (layer, head, op),
each probe running the script once over the window under the probe's plan, every probe inside
one process of the script (python/rewind/_serve.py; --jobs G: G processes) with the bits of a
process each, its model built without torch.nn.init's writes."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import unittest

from script_run import REWIND, SCRIPT, RecordedRun, needs_rewind, script, sha

import rewind

# pv=fault scales one head's O by ~(1 + strength / 256). Finite scales do not reach this tiny
# model's loss (the pre-LayerNorms and ln_f take them out: strength 25600, O x 101, moves the
# loss by ~0.02), so the fault is strong enough to overflow the next LayerNorm: NaN from step 20.
FAULT = "20:L1.H0.pv=fault(strength=1e30)"


@needs_rewind
class BisectCmd(RecordedRun):
    RECORD_ARGS = ("--steps", "40", "--checkpoint-every", "10", "--plan-from", FAULT)

    def test_planted_fault_is_localized_exactly(self):
        report = os.path.join(self.dir, "report")
        r = self.rewind_cli("bisect", "--cmd", self.cmd, "--store", self.store, "--window", "20:29",
                            "--fail", "nan", "--report", report, "--quiet")
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("verdict: localized", r.stdout)
        self.assertIn("searched: qk softmax pv o delta bwd (", r.stdout)  # no module: the script's own
        self.assertIn("failing set (kept low, everything else FP32, still fails): {L1.H0.pv}", r.stdout)
        self.assertIn("fixing set (promoted to FP32, the rest as recorded, passes): {L1.H0.pv}", r.stdout)
        self.assertIn("layers: L1   heads: L1.H0   ops: pv", r.stdout)
        self.assertNotIn("iter ", r.stdout)  # the script's own prints stay out of the verdict
        with open(os.path.join(report, "report.json")) as f:
            rep = json.load(f)
        probes = rep["probes"]
        first = probes[0]  # the recorded plan: NaN at the window's first step, stopped there
        self.assertEqual(first["verdict"], "fail")
        self.assertEqual(first["stopped_at"], 20)
        self.assertIn("L1.H0.pv=fault", first["plan"])
        self.assertEqual(probes[1]["verdict"], "pass")  # everything FP32 (the fault promoted away)
        self.assertEqual(len(probes[1]["loss"]), 10)
        for name in ("report.md", "report.html"):
            self.assertTrue(os.path.getsize(os.path.join(report, name)) > 0)
        # A second bisect answers from the probe cache.
        again = self.rewind_cli("bisect", "--cmd", self.cmd, "--store", self.store, "--window", "20:29",
                                "--fail", "nan", "--quiet")
        self.assertEqual(again.returncode, 4, again.stderr)
        self.assertIn("(0 run, 17 cached", again.stdout)  # the search's 15 (four fix checks among them), the hold check's 2
        # The hold check stops at the script's recording: a script's loop ends where it does.
        self.assertIn("hold check: trained on from step 20 through step 39 (10 steps past the window)", again.stdout)
        self.assertIn("fixing set fp32{L1.H0.pv}: held through step 39", again.stdout)
        self.assertIn("a script's run is checked up to its recording's last step, 39", again.stdout)
        self.assertNotIn("rewind train --fork", again.stdout)  # no fork of a script's run

    def test_one_process_serves_the_probes_with_the_bits_of_a_process_each(self):
        # Served: the script starts once. Read from standard input (`python3 - ARGS < script`)
        # it has no file to run again, so it replays the first probe alone and each later probe
        # starts it anew: the probes of a process each, which must have the same bits.
        args = shlex.split(self.cmd)[2:]
        stdin_cmd = " ".join([shlex.quote(sys.executable), "-"] + [shlex.quote(a) for a in args] +
                             ["<", shlex.quote(SCRIPT)])
        runs = {}
        for name, cmd, jobs in (("served", self.cmd, "1"), ("stdin", stdin_cmd, "1"), ("two", self.cmd, "2")):
            store, starts = (os.path.join(self.dir, name + ext) for ext in (".db", ".starts"))
            shutil.copyfile(self.store, store)
            r = self.rewind_cli("bisect", "--cmd", f"echo >> {shlex.quote(starts)}; {cmd}", "--store", store,
                                "--window", "20:29", "--fail", "nan", "--quiet", "--jobs", jobs)
            self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
            self.assertIn("failing set (kept low, everything else FP32, still fails): {L1.H0.pv}", r.stdout)
            said = {"served": "script: 1 process of the command ran", "two": "script: 2 processes of the command ran",
                    "stdin": "(it could not serve them from one process: "}[name]
            self.assertIn(said, r.stdout)
            with open(starts) as f:
                started = len(f.read().splitlines())
            probes = {}
            for p in rewind.open(store).probes():
                m = {k: v for k, v in p["metrics"].items() if not k.endswith("_s")}  # times differ
                probes[(p["plan"], p["window"])] = (p["verdict"], m)
            runs[name] = (started, probes)
        (served, a), (cold, b), (two, c) = runs["served"], runs["stdin"], runs["two"]
        self.assertEqual(served, 1)
        self.assertEqual(cold, len(b))
        self.assertGreater(len(a), 5)
        self.assertEqual(a, b)  # every probe: verdict, loss and grad norm bits, steps
        # --jobs 2: two serving processes, probes of a batch at once; the probes both searches
        # ran have the same bits.
        self.assertEqual(two, 2)
        common = set(a) & set(c)
        self.assertGreater(len(common), 5)
        self.assertEqual({k: a[k] for k in common}, {k: c[k] for k in common})

    def test_bad_requests_are_one_line_and_leave_the_store(self):
        before = sha(self.store)
        # Each fails at the first probe (a later one would leave the probes before it cached):
        # the window of the early exit lies before the fault, where the recorded plan runs on.
        early = script(self.store, *self.RECORD_ARGS, "--exit-after", "14")
        other_shape = script(self.store, "--steps", "40", "--checkpoint-every", "10", "--n-embd", "48")
        cases = [
            (("bisect", "--store", self.store, "--window", "20:29", "--fail", "nan"),
             "recorded by a Python script (rewind.record); give the command that runs it"),
            (("bisect", "--cmd", self.cmd, "--store", self.store, "--window", "20:29", "--fail", "nan",
              "--nproc-per-node", "2"), "a data-parallel script's launcher goes in the command"),
            (("bisect", "--cmd", f"{shlex.quote(sys.executable)} -c pass", "--store", self.store,
              "--window", "20:29", "--fail", "nan"), "without calling rewind.record"),
            (("bisect", "--cmd", self.cmd, "--store", self.store, "--window", "20:45", "--fail", "nan"),
             "is outside the recording (steps 0..39)"),
            (("bisect", "--cmd", early, "--store", self.store, "--window", "10:19", "--fail", "nan"),
             "the script exited with status 0 after step 14, before step 19"),
            (("bisect", "--cmd", other_shape, "--store", self.store, "--window", "20:29", "--fail", "nan"),
             "the model's parameter 'wte.weight' is [64, 48] float32 here, [64, 32] float32 in the recording"),
            (("bisect", "--cmd", self.cmd, "--store", self.store, "--window", "20:29", "--fail", "nan",
              "--reference", "L2.H0.pv=fp32"), "layer 2 out of range (model has 2 layers"),
        ]
        for args, text in cases:
            self.assert_one_line(self.rewind_cli(*args), 2, text)
        self.assertEqual(sha(self.store), before)


@needs_rewind
class ServedDrift(RecordedRun):
    """A script whose second run in one process differs from its own (here: a draw from torch's
    generator after the model's init, which a served probe skips) is caught at the first step
    under the recorded plan (here 15, from the checkpoint before the window), in one line;
    --script-per-probe bisects it."""
    RECORD_ARGS = ("--steps", "40", "--checkpoint-every", "15", "--plan-from", FAULT, "--draw-after-init")

    def test_a_drifting_served_probe_is_one_line_and_a_process_each_bisects(self):
        bisect = ("bisect", "--cmd", self.cmd, "--store", self.store, "--window", "20:29", "--fail", "nan", "--quiet")
        self.assert_one_line(self.rewind_cli(*bisect), 2, "from the recording's: the probe does not replay the recording")
        r = self.rewind_cli(*bisect, "--script-per-probe", "--fresh")
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("{L1.H0.pv}", r.stdout)


@needs_rewind
class EarlyVerdicts(RecordedRun):
    """A finite failure: a fault that scales one head's logits from step 20 (its max_logit
    monitor goes from ~1.6 to ~150 there, the loss stays finite), and a predicate on that
    monitor. A served probe is judged on each step as the script reports it: a failing one ends
    at its verdict (the script hears "stop" and ends its window), and its outcome has the bits
    of the same probe run whole by a process of its own; with --jobs 2, races cut probes short."""
    RECORD_ARGS = ("--steps", "40", "--checkpoint-every", "10", "--plan-from", "20:L1.H0.qk=fault(strength=25600)")

    def test_served_probes_end_at_their_verdict_with_the_bits_of_whole_windows(self):
        runs = {}
        for name, extra in (("served", ()), ("whole", ("--script-per-probe",)), ("two", ("--jobs", "2"))):
            store = os.path.join(self.dir, f"early_{name}.db")
            shutil.copyfile(self.store, store)
            r = subprocess.run([REWIND, "bisect", "--cmd", self.cmd, "--store", store, "--window", "20:29",
                                "--fail", "max(L1.H0.max_logit) > 50", "--quiet", "--hold-check", "0", *extra],
                               env={**os.environ, "REWIND_TIMES": "probe"}, capture_output=True, text=True)
            self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
            self.assertIn("failing set (kept low, everything else FP32, still fails): {L1.H0.qk}", r.stdout)
            ran = [int(n) for n in re.findall(r"rewind: probe times: .*?, (\d+) steps", r.stderr)]
            probes = {}
            for p in rewind.open(store).probes():
                m = {k: v for k, v in p["metrics"].items() if not k.endswith("_s")}  # times differ
                probes[(p["plan"], p["window"])] = (p["verdict"], m)
            runs[name] = (ran, probes)
        ran, served = runs["served"]
        # The recorded plan's probe runs whole one at a time (its steps time the recorded step),
        # judged all the same: where it would have stopped is its held_at.
        baseline = [k for k, (verdict, m) in served.items() if "stopped_at" not in m and verdict == "fail"]
        self.assertEqual(len(baseline), 1)
        self.assertEqual((served[baseline[0]][1]["held_at"], served[baseline[0]][1]["steps"]), (20, 10))
        fails = [m for k, (verdict, m) in served.items() if verdict == "fail" and k not in baseline]
        self.assertGreater(len(fails), 2)
        for m in fails:  # judged at step 20: the probe's steps end there
            self.assertEqual((m["stopped_at"], m["held_at"], m["steps"]), (20, 20, 1))
        # The script ran each failing probe's window only until it heard the verdict (a step or
        # two, the window's 10 on none of them); the passing ones whole.
        self.assertEqual(len(ran), len(served))
        self.assertEqual(sum(n < 10 for n in ran), len(fails))
        self.assertEqual(sum(n == 10 for n in ran), len(served) - len(fails))
        whole_ran, whole = runs["whole"]
        self.assertEqual(whole_ran, [10] * len(whole))  # a process each: every window whole
        self.assertEqual(served, whole)  # every probe: verdict, loss and grad-norm bits, steps
        _, two = runs["two"]  # races: the recorded plan's probe ends at its verdict too
        common = (set(served) & set(two)) - set(baseline)
        self.assertGreater(len(common), 5)
        self.assertEqual({k: served[k] for k in common}, {k: two[k] for k in common})


class ServedInit(unittest.TestCase):
    """A served probe builds the script's model without torch.nn.init's writes (the restore
    overwrites them); a tensor so left that the restore does not reach is one clear error."""

    def test_skipped_initializers_come_back_and_unrestored_tensors_are_named(self):
        import torch
        from rewind import _serve as serve
        real = torch.nn.init.normal_
        serve._skip_init()
        self.assertIsNot(torch.nn.init.normal_, real)
        lin = torch.nn.Linear(4, 4)  # kaiming_uniform_ and uniform_: left as torch.empty made them
        serve.end_skipped_init(list(lin.state_dict(keep_vars=True).values()))  # all restored: fine
        self.assertIs(torch.nn.init.normal_, real)
        self.assertNotEqual(float(torch.nn.init.normal_(torch.zeros(1000)).abs().sum()), 0.0)
        serve._skip_init()
        lin = torch.nn.Linear(4, 4)
        outside = torch.nn.init.normal_(torch.zeros(3))  # e.g. a random projection kept outside the state
        with self.assertRaisesRegex(RuntimeError, r"initializes a \(3,\) tensor that its checkpoint does not restore"):
            serve.end_skipped_init(list(lin.state_dict(keep_vars=True).values()))
        self.assertIs(torch.nn.init.normal_, real)
        del outside


if __name__ == "__main__":
    unittest.main()
