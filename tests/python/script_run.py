"""Shared by the tests that record tiny_train.py and drive it through the rewind binary
(`replay|bisect|doctor --cmd`): the command lines and a test case that records a run once."""
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "tiny_train.py")
REWIND = os.environ.get("REWIND_BIN", "")
needs_rewind = unittest.skipUnless(REWIND and os.path.exists(REWIND), "needs the rewind binary (REWIND_BIN)")


def script(store, *args):
    """The shell command that runs tiny_train.py on `store` with `args`."""
    return " ".join(shlex.quote(a) for a in [sys.executable, SCRIPT, "--store", store, *args])


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class RecordedRun(unittest.TestCase):
    """Records `cls.store` once with tiny_train.py `RECORD_ARGS` (cls.cmd) in a folder of its own."""
    RECORD_ARGS = ("--steps", "20")

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="rewind_script_")
        cls.store = os.path.join(cls.dir, "run.db")
        cls.cmd = cls.command(cls.store)
        r = subprocess.run(cls.cmd, shell=True, capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError("recording failed: " + r.stderr[-2000:])

    @classmethod
    def command(cls, store):
        """The command that records `store` (and replays it, given a window)."""
        return script(store, *cls.RECORD_ARGS)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def rewind_cli(self, *args):
        return subprocess.run([REWIND, *args], capture_output=True, text=True)

    def assert_one_line(self, r, code, text):
        """Exit `code` and `text` in the last line of stderr, rewind's one-line error (the
        script's own traceback may precede it)."""
        self.assertEqual(r.returncode, code, r.stdout + r.stderr)
        last = r.stderr.strip().splitlines()[-1]
        self.assertTrue(last.startswith("rewind: error: "), last)
        self.assertIn(text, last)
