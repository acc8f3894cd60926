"""rewind.record in a data-parallel script: tiny_train.py on two gloo ranks with DDP on the CPU
(launch_ranks.py in torchrun's place). Rank 0 records every rank's batches and generators; a
replay under the same number of ranks is bitwise (--verify), on another number it is refused in
one line; a fault planted in one head is localized by bisect --cmd starting the ranks for each
probe; rewind doctor refuses the ranks."""
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import torch

import rewind
from script_run import SCRIPT, RecordedRun, needs_rewind

LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_ranks.py")


def ranks_cmd(n, store, *args):
    """The shell command that runs tiny_train.py on `n` ranks (n = 1: one plain process)."""
    return " ".join(shlex.quote(a) for a in [sys.executable, LAUNCH, str(n), sys.executable, SCRIPT,
                                             "--store", store, *args])


def rank_pid(marker, rank):
    """The pid of the process of rank `rank` (its RANK variable) whose command line holds `marker`."""
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"RANK={rank}".encode() in f.read().split(b"\0"):
                    return pid
        except OSError:
            pass
    raise AssertionError(f"no process of rank {rank} with {marker} in its command line")


@needs_rewind
@unittest.skipUnless(torch.distributed.is_available(), "needs torch.distributed")
class DataParallel(RecordedRun):
    RECORD_ARGS = ("--steps", "30", "--checkpoint-every", "10", "--plan-from", "20:L1.H0.pv=fault(strength=1e30)")

    @classmethod
    def command(cls, store):
        return ranks_cmd(2, store, *cls.RECORD_ARGS)

    def test_rank_0_records_every_ranks_batches(self):
        run = rewind.open(self.store).run()
        self.assertEqual(run.meta["world_size"], 2)
        self.assertEqual(run.steps()["step"].tolist(), list(range(30)))
        x0, y0 = run.batch(5, rank=0)
        x1, y1 = run.batch(5, rank=1)
        self.assertEqual(tuple(x0.shape), (4, 16))
        self.assertFalse(torch.equal(x0, x1))  # each rank drew its own (seeds 1337 + rank)
        self.assertTrue(torch.equal(x1[:, 1:], y1[:, :-1]))
        with self.assertRaises(ValueError):
            run.batch(5, rank=2)
        info = self.rewind_cli("store", "info", self.store)
        self.assertIn("recorded by a Python script (rewind.record), 2 data-parallel ranks", info.stdout)

    def test_replay_on_the_recorded_ranks_is_bitwise(self):
        r = self.rewind_cli("replay", "--cmd", self.cmd, "--store", self.store,
                            "--from", "12", "--to", "17", "--verify")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("verified: every step from 10 to 17 is bitwise identical", r.stdout)

    def test_replay_on_another_number_of_ranks_is_refused_in_one_line(self):
        r = self.rewind_cli("replay", "--cmd", ranks_cmd(1, self.store, *self.RECORD_ARGS), "--store", self.store,
                            "--from", "12", "--to", "17", "--verify")
        self.assert_one_line(r, 2, "run 1 was recorded on 2 rank(s) and this replay runs 1")

    def test_a_planted_fault_is_localized_by_ranks_serving_every_probe(self):
        store = os.path.join(self.dir, "bisect.db")
        shutil.copyfile(self.store, store)
        r = self.rewind_cli("bisect", "--cmd", self.cmd, "--store", store, "--window", "20:25", "--fail", "nan", "--quiet")
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("failing set (kept low, everything else FP32, still fails): {L1.H0.pv}", r.stdout)
        self.assertIn("fixing set (promoted to FP32, the rest as recorded, passes): {L1.H0.pv}", r.stdout)
        self.assertIn("script: 1 process of the command ran", r.stdout)  # one launcher's ranks served them all

    def test_served_ranks_check_rank_0s_steps_against_the_recording(self):
        # Steps under the recorded plan must have the recorded bits (rank 0's loss and the
        # digest); the other ranks' own losses differ from rank 0's and are not compared.
        store = os.path.join(self.dir, "clean.db")
        shutil.copyfile(self.store, store)
        r = self.rewind_cli("bisect", "--cmd", self.cmd, "--store", store, "--window", "10:15", "--fail", "nan",
                            "--quiet")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("verdict: not-reproducible", r.stdout)

    def test_a_killed_rank_ends_the_job_and_leaves_a_store_that_verifies_and_replays(self):
        store = os.path.join(self.dir, "killed.db")
        cmd = ranks_cmd(2, store, "--steps", "400", "--checkpoint-every", "3")
        p = subprocess.Popen(cmd, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and p.poll() is None:
                time.sleep(0.2)
                try:
                    run = rewind.open(store).run()
                    if len(run.steps()["step"]) >= 12 and len(run.checkpoint_steps()) >= 3:
                        break
                except (ValueError, IndexError):  # not created yet, or no run yet
                    pass
            self.assertIsNone(p.poll())
            os.kill(rank_pid(store, 1), signal.SIGKILL)  # rank 1 alone: the launcher ends rank 0
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(self.rewind_cli("store", "verify", store).returncode, 0)
        run = rewind.open(store).run()
        self.assertEqual(run.checkpoint_steps()[:3], [0, 3, 6])
        r = self.rewind_cli("replay", "--cmd", cmd, "--store", store, "--from", "7", "--to", "10", "--verify")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("verified: every step from 6 to 10", r.stdout)

    def test_doctor_refuses_the_ranks(self):
        r = self.rewind_cli("doctor", "--cmd", ranks_cmd(2, self.store + ".doctor"))
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("rewind doctor runs the script as one process", r.stdout + r.stderr)


@needs_rewind
@unittest.skipUnless(torch.distributed.is_available(), "needs torch.distributed")
class ServedRanks(RecordedRun):
    """The ranks of one launcher serve every probe (rank 0 over rewind's socket, handing each
    probe to the others) and end a failing one at its verdict together: the probes have the
    bits of the same probes run by a launcher each (--script-per-probe), whole."""
    RECORD_ARGS = ("--steps", "30", "--checkpoint-every", "10", "--plan-from", "20:L1.H0.qk=fault(strength=25600)")

    @classmethod
    def command(cls, store):
        return ranks_cmd(2, store, *cls.RECORD_ARGS)

    def test_gpus_go_to_the_jobs_a_rank_each(self):
        # --gpus 0,1,2,3 on a 2-rank recording: two jobs, GPUs 0,1 and 2,3 (CUDA_VISIBLE_DEVICES,
        # which the CPU ignores); a list the ranks do not divide is one line.
        store, seen = os.path.join(self.dir, "gpus.db"), os.path.join(self.dir, "gpus.txt")
        shutil.copyfile(self.store, store)
        r = self.rewind_cli("bisect", "--cmd", f"echo $CUDA_VISIBLE_DEVICES >> {shlex.quote(seen)}; {self.cmd}",
                            "--store", store, "--window", "20:25", "--fail", "max(L1.H0.max_logit) > 50",
                            "--gpus", "0,1,2,3", "--quiet")
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("jobs 2)", r.stdout)
        with open(seen) as f:
            self.assertEqual(sorted(f.read().split()), ["0,1", "2,3"])
        bad = self.rewind_cli("bisect", "--cmd", self.cmd, "--store", store, "--window", "20:25", "--fail", "nan",
                              "--gpus", "0,1,2")
        self.assert_one_line(bad, 2, "was recorded on 2 ranks: --gpus lists 2 GPUs a job, got 3")

    def test_served_ranks_have_the_bits_of_a_launcher_a_probe(self):
        runs = {}
        for name, extra in (("served", ()), ("whole", ("--script-per-probe",))):
            store = os.path.join(self.dir, f"{name}.db")
            shutil.copyfile(self.store, store)
            r = self.rewind_cli("bisect", "--cmd", self.cmd, "--store", store, "--window", "20:25",
                                "--fail", "max(L1.H0.max_logit) > 50", "--quiet", *extra)
            self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
            self.assertIn("failing set (kept low, everything else FP32, still fails): {L1.H0.qk}", r.stdout)
            runs[name] = {(p["plan"], p["window"]): (p["verdict"], {k: v for k, v in p["metrics"].items()
                                                                   if not k.endswith("_s")})
                          for p in rewind.open(store).probes()}
            self.assertIn("script: 1 process of the command ran" if name == "served" else "--script-per-probe", r.stdout)
        served, whole = runs["served"], runs["whole"]
        self.assertGreater(len(served), 5)
        self.assertEqual(served, whole)  # every probe: verdict, steps, loss and grad norm bits
        stopped = [m for verdict, m in served.values() if "stopped_at" in m]
        self.assertGreater(len(stopped), 2)  # ended at their verdict, on both ranks at once


@unittest.skipUnless(torch.distributed.is_available(), "needs torch.distributed")
class UnevenBatches(unittest.TestCase):
    """Ranks whose batches differ in shape are refused in one line (each rank sees every rank's
    shapes), and the job ends with its status."""

    SCRIPT = """
import sys, torch, torch.distributed as dist
import rewind
dist.init_process_group("gloo")
model = torch.nn.Linear(4, 4)
rec = rewind.record(sys.argv[1], model, torch.optim.SGD(model.parameters(), lr=0.1))
try:
    rec.batch(lambda: torch.zeros(3 + dist.get_rank(), 4))
except rewind.RewindError as e:
    print(e)
    sys.exit(3)
"""

    def test_batches_of_other_shapes_are_refused_on_every_rank(self):
        with tempfile.TemporaryDirectory(prefix="rewind_ddp_") as d:
            r = subprocess.run([sys.executable, LAUNCH, "2", sys.executable, "-c", self.SCRIPT, os.path.join(d, "run.db")],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
            # (the launcher, as torchrun, stops the other rank when the first one ends)
            lines = [line for line in r.stdout.splitlines() if line.startswith("rec.batch")]
            self.assertGreaterEqual(len(lines), 1, r.stdout)
            self.assertIn("a data-parallel recording needs batches of one shape on every rank", lines[0])
            self.assertIn("float32 (4, 4) on rank 1", r.stdout)


if __name__ == "__main__":
    unittest.main()
