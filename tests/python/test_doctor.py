"""`rewind doctor --cmd`: tiny_train.py run twice over its first two steps; a run-dependent op
switched on (--nondeterministic: CUDA's atomic index_add emulated on the CPU, or noise from a
generator seeded from OS entropy) is named with its module and the switch that fixes it; the
deterministic script gets "no difference found" and exit 0; nothing is recorded."""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

from script_run import REWIND, needs_rewind, script


@needs_rewind
class Doctor(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="rewind_doctor_")
        self.store = os.path.join(self.dir, "never.db")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def doctor(self, *args):
        r = subprocess.run([REWIND, "doctor", "--cmd", script(self.store, *args)], capture_output=True, text=True)
        self.assertFalse(os.path.exists(self.store))  # doctor records nothing
        return r

    def test_deterministic_script_has_no_difference(self):
        r = self.doctor()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("ran the first 2 step(s) of the script twice", r.stdout)
        self.assertIn("no difference found", r.stdout)

    def test_bf16_autocast_has_no_difference(self):
        # Under autocast the attention's backward returns views (select) into gradient buffers
        # its kernel writes after they are made: a view's bits at the time it is made are no
        # result, and the run's real results (the written buffer, the parameters) repeat.
        r = self.doctor("--autocast")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("no difference found", r.stdout)

    def test_atomic_index_add_is_named(self):
        r = self.doctor("--nondeterministic", "index_add")
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"first difference: step 0, op #\d+ aten\.index_add_\.default in the forward "
                                   r"of module 'odd' \(RunDependent\): its output \(4, 32\) float32 has other bits")
        self.assertRegex(r.stdout, r"fix: torch\.use_deterministic_algorithms")

    def test_unseeded_random_op_is_named(self):
        r = self.doctor("--nondeterministic", "noise")
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("aten.randn.generator in the forward of module 'odd' (RunDependent)", r.stdout)
        self.assertIn("fix: a random op whose generator is in another state in the second run: seed it", r.stdout)

    def test_unseeded_initialization_is_named(self):
        r = self.doctor("--unseeded")
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("first difference: the parameters before the first step: other bits in the second run",
                      r.stdout)
        self.assertIn("fix: seed the model's initialization: torch.manual_seed(...) before the model is built",
                      r.stdout)

    def test_script_that_stops_early_is_one_line(self):
        r = self.doctor("--steps", "1")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stderr.strip().splitlines()[-1],
                         "rewind: error: doctor --cmd: the script exited with status 0 in step 0, before the end "
                         "of step 1 (does its loop run that far?)")

    def test_script_without_recorder_is_one_line(self):
        r = subprocess.run([REWIND, "doctor", "--cmd", f"{shlex.quote(sys.executable)} -c pass"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stderr.strip(), "rewind: error: doctor --cmd: the script exited with status 0 "
                                           "without calling rewind.record (nothing to check)")


if __name__ == "__main__":
    unittest.main()
