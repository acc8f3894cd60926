"""experiments/instrument_bench/bench.py in its tiny CPU mode (~15 s on 2 cores): the rows asked
for are in its table and CSV with a step time for every variant, two instrumented runs give the
same loss bits, the recorded run gives the instrumented run's, and the compiled instrumented model
compiles as many graphs as the plain one, with no graph break and no recompile-limit hit. The numbers
themselves are the GPU run's business (experiments/instrument_bench/device.sh)."""
import csv
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "experiments", "instrument_bench", "bench.py")
ROWS = [("tiny nanogpt", "eager"), ("tiny nanogpt", "compiled"), ("tiny hf", "eager")]


def torch_version():
    """(major, minor) of the installed torch, read without importing it (the run is a subprocess)."""
    try:
        return tuple(int(x) for x in re.findall(r"\d+", importlib.metadata.version("torch"))[:2])
    except importlib.metadata.PackageNotFoundError:  # Debian's python3-torch has no pip metadata: 1.13
        return (1, 13)


@unittest.skipUnless(torch_version() >= (2, 1) and importlib.util.find_spec("transformers") is not None,
                     "needs torch >= 2.1 (torch.compile, torch.compiler) and transformers")
class InstrumentBench(unittest.TestCase):
    def test_tiny_cpu_run_has_every_row_and_passes_its_checks(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "results.csv")
            # backend="eager": dynamo's graphs and breaks without inductor's minutes of compiling
            r = subprocess.run([sys.executable, BENCH, "--tiny", "--device", "cpu", "--steps", "1", "--warmup", "1",
                                "--det-steps", "2", "--backend", "eager", "--variants", "plain,instrumented,recorded",
                                "--rows", "nanogpt:eager,nanogpt:compiled,hf:eager", "--out", out],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            with open(out, newline="") as f:
                rows = list(csv.DictReader(f))
            with open(os.path.join(d, "results.txt")) as f:
                text = f.read()
        self.assertEqual([(row["model"], row["mode"]) for row in rows], ROWS)
        for row in rows:
            what = f"{row['model']} {row['mode']}"
            self.assertEqual(row["errors"], "", what)
            for v in ("plain", "instrumented", "recorded"):
                self.assertGreater(float(row[f"{v}_ms"]), 0, f"{what} {v}")
            self.assertEqual(row["deterministic"], "yes", what)
            self.assertEqual(row["recorded_same_losses"], "yes", what)
            self.assertRegex(text, rf"(?m)^{row['model']} +{row['mode']} ")
        compiled = rows[1]
        self.assertEqual(int(compiled["breaks_plain"]), 0)      # the plain model: one graph
        self.assertEqual(int(compiled["breaks_instr"]), 0)      # rewind's attention: a custom op in the graph
        self.assertEqual(compiled["graphs_instr"], compiled["graphs_plain"])
        self.assertEqual(int(compiled["recompile_limit_hits"]), 0)

    def test_interleaved_run_times_every_variant_and_keeps_its_checks(self):
        """--interleave: every variant built first, their steps timed in turns; the same checks
        hold (each variant's own bits, recording changes none, one graph each when compiled)."""
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "results.csv")
            r = subprocess.run([sys.executable, BENCH, "--tiny", "--device", "cpu", "--steps", "3", "--warmup", "1",
                                "--det-steps", "2", "--backend", "eager", "--interleave",
                                "--rows", "nanogpt:compiled,hf:eager", "--out", out],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            with open(out, newline="") as f:
                rows = list(csv.DictReader(f))
        self.assertEqual([(row["model"], row["mode"]) for row in rows], [("tiny nanogpt", "compiled"), ("tiny hf", "eager")])
        for row in rows:
            what = f"{row['model']} {row['mode']}"
            self.assertEqual(row["errors"], "", what)
            self.assertEqual(row["timing"], "interleaved", what)
            for v in ("plain", "plain_det", "instrumented", "recorded"):
                self.assertGreater(float(row[f"{v}_ms"]), 0, f"{what} {v}")
            self.assertEqual(row["deterministic"], "yes", what)
            self.assertEqual(row["recorded_same_losses"], "yes", what)
        compiled = rows[0]
        self.assertEqual((int(compiled["breaks_plain"]), int(compiled["breaks_instr"])), (0, 0))
        self.assertEqual(compiled["graphs_instr"], compiled["graphs_plain"])
        self.assertEqual(int(compiled["recompile_limit_hits"]), 0)


if __name__ == "__main__":
    unittest.main()
