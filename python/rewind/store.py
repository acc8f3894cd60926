"""Read a rewind store: runs with their config, plan and metadata, per-step series as numpy
arrays (a pandas DataFrame when pandas is installed and asked for), per-head monitors, captured
attention tensors and checkpoints as torch tensors, and bisect reports as dicts."""
import json

import numpy as np

from . import _C


def _frame(columns, as_frame):
    if as_frame:
        import pandas  # only when asked for: pandas is optional
        return pandas.DataFrame(columns)
    return columns


class Run:
    """One recorded run of a store."""

    def __init__(self, path, row):
        self.path = path
        self.id = row["id"]
        self.created = row["created"]
        self.config = json.loads(row["config"])
        self.meta = json.loads(row["meta"])
        try:
            self.plan = json.loads(row["plan"])
        except ValueError:
            self.plan = row["plan"]

    def __repr__(self):
        return f"<rewind run {self.id} of {self.path}: {self.config.get('n_layer')} layers>"

    def steps(self, as_frame=False):
        """step, lr, loss, grad_norm (numpy arrays; loss and grad norm are the recorded FP32
        values), param_digest and batch_hash (lists of str)."""
        raw = _C.store_steps(self.path, self.id)
        cols = {"step": np.asarray(raw["step"], dtype=np.int64),
                "lr": np.asarray(raw["lr"], dtype=np.float64),
                "loss": np.asarray(raw["loss"], dtype=np.float32),
                "grad_norm": np.asarray(raw["grad_norm"], dtype=np.float32),
                "param_digest": raw["param_digest"], "batch_hash": raw["batch_hash"]}
        return _frame(cols, as_frame)

    def metrics(self, prefix="", as_frame=False):
        """Per-step metrics (lr, step time, per-head monitors such as "L1.H2.max_logit") as
        {"step": array, key: array, ...} over the steps that have any; NaN where a key is
        missing at a step."""
        steps, keys, values = _C.store_metrics(self.path, self.id, prefix)
        all_steps = np.unique(np.asarray(steps, dtype=np.int64))
        row = {s: i for i, s in enumerate(all_steps.tolist())}
        cols = {"step": all_steps}
        for s, k, v in zip(steps, keys, values):
            if k not in cols:
                cols[k] = np.full(len(all_steps), np.nan)
            cols[k][row[s]] = v
        return _frame(cols, as_frame)

    def checkpoint_steps(self):
        return list(_C.store_checkpoint_steps(self.path, self.id))

    def checkpoint(self, step):
        """The training state at a checkpoint: {"param/<name>", "adam_m/<name>",
        "adam_v/<name>", "step", ...} -> torch tensors."""
        return _C.store_checkpoint(self.path, self.id, step)

    def tensors(self):
        """Captured attention tensors: dicts with step, layer, head, name, dtype, shape."""
        return list(_C.store_tensors(self.path, self.id))

    def tensor(self, name, step, layer=-1, head=-1):
        """One captured tensor (q, k, v, o, lse, do, delta per head; x per layer, head -1)."""
        return _C.store_tensor(self.path, self.id, step, layer, head, name)

    def bisect_reports(self):
        """Each bisect job on this run: {"job": its options, "log": [probes], "verdict": str}."""
        kv = _C.store_kv(self.path, self.id, "bisect/")
        jobs = {}
        for key, text in kv.items():
            _, kind, job = key.split("/", 2)
            try:
                value = json.loads(text)
            except ValueError:
                value = text
            jobs.setdefault(job, {})[kind] = value
        return jobs

    def kv(self, prefix=""):
        """The run's text entries (divergence curves, bisect state, import metadata)."""
        return dict(_C.store_kv(self.path, self.id, prefix))


class Store:
    """A rewind store file (opened read-only for each read; safe beside a running recorder)."""

    def __init__(self, path):
        self.path = str(path)
        self.runs = [Run(self.path, r) for r in _C.store_runs(self.path)]

    def __repr__(self):
        return f"<rewind store {self.path}: {len(self.runs)} runs>"

    def run(self, run_id=None):
        """A run by id; the last one by default."""
        if run_id is None:
            return self.runs[-1]
        for r in self.runs:
            if r.id == run_id:
                return r
        raise KeyError(f"store {self.path} has no run {run_id}")

    def probes(self, job=""):
        """The bisect probe cache: dicts with job, plan, window, verdict, metrics, wall_s."""
        out = []
        for p in _C.store_probes(self.path, job):
            p = dict(p)
            p["metrics"] = json.loads(p["metrics"]) if p["metrics"] else {}
            out.append(p)
        return out


def open(path):  # noqa: A001  (rewind.open, like the issue asks)
    """Opens a rewind store for reading; raises rewind.RewindError (a ValueError) for anything
    that is not one."""
    return Store(path)
