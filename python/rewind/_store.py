"""Read a rewind store: runs with their config, plan and metadata, per-step series as numpy
arrays (a pandas DataFrame when pandas is installed and asked for), per-head monitors, captured
attention tensors and checkpoints as torch tensors, and bisect reports as dicts."""
from __future__ import annotations

import json
import os
import pickle
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch

from . import _C
from ._batches import decode_batch
from ._values import _unflatten


def _frame(columns, as_frame):
    if as_frame:
        try:
            import pandas  # only when asked for: pandas is optional
        except ImportError:
            raise ImportError("as_frame=True needs pandas: pip install pandas (Debian: apt-get install "
                              "python3-pandas); without it the columns come as numpy arrays") from None
        return pandas.DataFrame(columns)
    return columns


def _offsets(extra):
    """A step's sample offsets, (micro-batches, batch) int64, from its extra JSON (None if absent)."""
    try:
        offsets = json.loads(extra).get("offsets") if extra else None
    except ValueError:
        return None
    return None if offsets is None else np.asarray(offsets, dtype=np.int64)


class Run:
    """One recorded run of a store (`Store.runs`, `Store.run()`).

    Attributes:
        path: the store's file.
        id: the run's id in the store.
        created: when it was recorded.
        config: the run's config (a dict).
        meta: what the recorder noted (a dict: "kind" is "python" for rewind.record's runs).
        plan: the recorded plan (a spec string, or a schedule dict).
    """

    def __init__(self, path: str, row: Dict[str, Any]):
        self.path = path
        self.id = row["id"]
        self.created = row["created"]
        self._config_json = row["config"]
        self.config = json.loads(row["config"])
        self.meta = json.loads(row["meta"])
        try:
            self.plan = json.loads(row["plan"])
        except ValueError:
            self.plan = row["plan"]

    def __repr__(self):
        return f"<rewind run {self.id} of {self.path}: {self.config.get('n_layer')} layers>"

    def steps(self, *, as_frame: bool = False) -> Any:
        """The per-step series.

        Args:
            as_frame: a pandas DataFrame instead of a dict of columns (needs pandas).

        Returns:
            {"step", "lr", "loss", "grad_norm": numpy arrays (loss and grad norm are the
            recorded FP32 values), "param_digest", "batch_hash": lists of str, "offsets": per
            step the sample offsets into the token file, an int64 array
            (gradient_accumulation_steps, batch_size) (row i of micro-batch m is tokens
            offsets[m, i] .. + block_size; None where not recorded)}.

        Raises:
            ImportError: as_frame=True without pandas, saying how to install it.
        """
        raw = _C.store_steps(self.path, self.id)
        cols = {"step": np.asarray(raw["step"], dtype=np.int64),
                "lr": np.asarray(raw["lr"], dtype=np.float64),
                "loss": np.asarray(raw["loss"], dtype=np.float32),
                "grad_norm": np.asarray(raw["grad_norm"], dtype=np.float32),
                "param_digest": raw["param_digest"], "batch_hash": raw["batch_hash"],
                "offsets": [_offsets(e) for e in raw["extra"]]}
        return _frame(cols, as_frame)

    def batch(self, step: int, *, data: Optional[str] = None, rank: int = 0) -> Any:
        """The batch a recorded step trained on.

        Args:
            step: the step.
            data: the token file of a `rewind train` run (default: the recorded path; uint16
                like train.bin).
            rank: of a data-parallel script's recording, whose batch.

        Returns:
            A run of rewind.record: what its get_batch returned, on the CPU. A run of `rewind
            train`: (x, y) as nanoGPT's get_batch makes them, int64 tensors of shape
            (micro-batches, batch_size, block_size), y = x shifted by one token.

        Raises:
            KeyError: the run has no such step (or no recorded offsets for it).
            ValueError: `rank` is not one of the recording's ranks.
        """
        if self.meta.get("kind") == "python":
            rec = _C.ScriptReplay(self.path).step(self.id, step)
            if rec is None:
                raise KeyError(f"run {self.id} of {self.path} has no recorded step {step}")
            return decode_batch(rec, device="cpu", rank=rank)
        s = self.steps()
        where = np.flatnonzero(s["step"] == step)
        if len(where) == 0 or s["offsets"][where[0]] is None:
            raise KeyError(f"run {self.id} of {self.path} has no recorded offsets for step {step}")
        offsets = s["offsets"][where[0]]
        tokens = np.memmap(data or self.meta["data_path"], dtype=np.uint16, mode="r")
        t = self.config["block_size"]
        rows = np.stack([tokens[o:o + t + 1].astype(np.int64) for o in offsets.reshape(-1)])
        rows = torch.from_numpy(rows).view(*offsets.shape, t + 1)
        return rows[..., :-1].contiguous(), rows[..., 1:].contiguous()

    def metrics(self, prefix: str = "", *, as_frame: bool = False) -> Any:
        """Per-step metrics: lr, step time, per-head monitors such as "L1.H2.max_logit".

        Args:
            prefix: only the keys that start with it ("L3.").
            as_frame: a pandas DataFrame instead of a dict of columns (needs pandas).

        Returns:
            {"step": array, key: array, ...} over the steps that have any; NaN where a key is
            missing at a step.
        """
        steps, keys, values = _C.store_metrics(self.path, self.id, prefix)
        all_steps = np.unique(np.asarray(steps, dtype=np.int64))
        row = {s: i for i, s in enumerate(all_steps.tolist())}
        cols = {"step": all_steps}
        for s, k, v in zip(steps, keys, values):
            if k not in cols:
                cols[k] = np.full(len(all_steps), np.nan)
            cols[k][row[s]] = v
        return _frame(cols, as_frame)

    def checkpoint_steps(self) -> List[int]:
        """The steps that have a checkpoint, ascending."""
        return list(_C.store_checkpoint_steps(self.path, self.id))

    def checkpoint(self, step: int, *, names: str = "rewind") -> Dict[str, torch.Tensor]:
        """The training state at a checkpoint.

        Args:
            step: a step of checkpoint_steps().
            names: "rewind": the stored names; "nanogpt": the model's state_dict under
                nanoGPT's names instead ("transformer.wte.weight",
                "transformer.h.0.attn.c_attn.weight", ..., "lm_head.weight", tied to wte),
                which nanoGPT's GPT.load_state_dict(..., strict=True) takes; the map is the one
                `rewind export nanogpt` writes with (with the causal-mask buffers attn.bias of a
                run imported from a checkpoint that had them). The AdamW state: `rewind export`.

        Returns:
            {"param/<name>", "adam_m/<name>", "adam_v/<name>", "step", ...} -> torch tensors
            (a run of rewind.record: "model/<key>", "optimizer/...", "skeleton", "rng/...";
            script_checkpoint() rebuilds its state_dicts), or nanoGPT's state_dict.

        Raises:
            ValueError: another `names`.
            rewind.RewindError: no checkpoint at `step`.
        """
        state = _C.store_checkpoint(self.path, self.id, step)
        if names == "rewind":
            return state
        if names != "nanogpt":
            raise ValueError(f"names must be 'rewind' or 'nanogpt', not {names!r}")
        extra = self.kv("nanogpt").get("nanogpt")
        masks = bool(extra) and json.loads(extra).get("mask_buffers", False)
        t = self.config["block_size"]
        model = {}
        for nano, ours in _C.nanogpt_names(self._config_json):
            if masks and nano.endswith(".attn.c_attn.weight"):  # the buffer precedes the children
                model[nano[:-len("c_attn.weight")] + "bias"] = torch.ones(t, t).tril().view(1, 1, t, t)
            model[nano] = state["param/" + ours]
        model["lm_head.weight"] = model["transformer.wte.weight"]
        return model

    def script_checkpoint(self, step: int) -> Dict[str, Any]:
        """A checkpoint of a run that rewind.record made, as the script's load_state_dict
        calls take it.

        Args:
            step: a step of checkpoint_steps().

        Returns:
            {"model": the model's state_dict, "optimizer": the optimizer's, "state": {name:
            state_dict} of record's state=, "step": step}.

        Raises:
            ValueError: a run of `rewind train` (Run.checkpoint reads those).
            rewind.RewindError: no checkpoint at `step`.
        """
        if self.meta.get("kind") != "python":
            raise ValueError(f"run {self.id} was recorded by rewind train: Run.checkpoint(step)")
        state = dict(_C.ScriptReplay(self.path).checkpoint(self.id, step))
        skeleton = pickle.loads(state["skeleton"].numpy().tobytes())
        return {"model": _unflatten(skeleton["model"], state), "optimizer": _unflatten(skeleton["optimizer"], state),
                "state": {k: _unflatten(v, state) for k, v in skeleton.get("state", {}).items()},
                "step": int(skeleton["step"])}

    def export_nanogpt(self, step: int, path: Union[str, os.PathLike]) -> None:
        """Writes the checkpoint at `step` of a Python script's run of nanoGPT's GPT as nanoGPT's
        ckpt.pt (model, optimizer, model_args, iter_num, best_val_loss, config), which its
        train.py resumes from (--init_from=resume). The model args come from the recorded
        config (nanoGPT's config dict: rewind.record's config=) and the vocabulary from the
        embedding. A run of rewind train: `rewind export nanogpt`.

        Args:
            step: a step of checkpoint_steps().
            path: the file to write; it must not exist yet.

        Raises:
            FileExistsError: `path` exists.
            ValueError: not nanoGPT's GPT, or a config without nanoGPT's model args.
        """
        if os.path.exists(path):
            raise FileExistsError(f"{path} exists; rewind does not overwrite it")
        ck = self.script_checkpoint(step)
        wte = ck["model"].get("transformer.wte.weight")
        if wte is None:
            raise ValueError(f"run {self.id}'s model has no transformer.wte.weight: not nanoGPT's GPT "
                             f"(its state as the script saves it: Run.script_checkpoint)")
        need = ("n_layer", "n_head", "n_embd", "block_size", "bias")
        missing = [k for k in need if k not in self.config]
        if missing:
            raise ValueError(f"run {self.id}'s config lacks {', '.join(missing)}: record with config=config "
                             f"(nanoGPT's config dict)")
        args = {k: self.config[k] for k in need}
        args.update(vocab_size=int(wte.shape[0]), dropout=self.config.get("dropout", 0.0))
        torch.save({"model": ck["model"], "optimizer": ck["optimizer"], "model_args": args,
                    "iter_num": ck["step"], "best_val_loss": 1e9, "config": self.config}, path)

    def tensors(self) -> List[Dict[str, Any]]:
        """Captured attention tensors (`rewind train --capture`): dicts with step, layer, head,
        name, dtype, shape."""
        return list(_C.store_tensors(self.path, self.id))

    def tensor(self, name: str, step: int, *, layer: int = -1, head: int = -1) -> torch.Tensor:
        """One captured tensor.

        Args:
            name: q, k, v, o, lse, do, delta (per head) or x (per layer, head -1).
            step, layer, head: where it was captured.

        Returns:
            The tensor.

        Raises:
            rewind.RewindError: nothing so captured.
        """
        return _C.store_tensor(self.path, self.id, step, layer, head, name)

    def bisect_reports(self) -> Dict[str, Dict[str, Any]]:
        """Each bisect job on this run: {job: {"job": its options, "log": [probes], "verdict":
        str}}."""
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

    def kv(self, prefix: str = "") -> Dict[str, str]:
        """The run's text entries (divergence curves, bisect state, import metadata, the op
        names a recording saw under "ops") whose keys start with `prefix`."""
        return dict(_C.store_kv(self.path, self.id, prefix))


class Store:
    """A rewind store file (opened read-only for each read; safe beside a running recorder).

    Attributes:
        path: the file.
        runs: its runs (`rewind.Run`), oldest first.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = str(path)
        self.runs = [Run(self.path, r) for r in _C.store_runs(self.path)]

    def __repr__(self):
        return f"<rewind store {self.path}: {len(self.runs)} runs>"

    def run(self, run_id: Optional[int] = None) -> Run:
        """A run by id; the last one by default.

        Raises:
            KeyError: no run of that id.
        """
        if run_id is None:
            return self.runs[-1]
        for r in self.runs:
            if r.id == run_id:
                return r
        raise KeyError(f"store {self.path} has no run {run_id}")

    def probes(self, job: str = "") -> List[Dict[str, Any]]:
        """The bisect probe cache (of one bisect job, or of all with job=""): dicts with job,
        plan, window, verdict, metrics, wall_s."""
        out = []
        for p in _C.store_probes(self.path, job):
            p = dict(p)
            p["metrics"] = json.loads(p["metrics"]) if p["metrics"] else {}
            out.append(p)
        return out


def open(path: Union[str, os.PathLike]) -> Store:  # noqa: A001  (shadows the builtin on purpose: the package's reader)
    """Opens a rewind store for reading.

    Args:
        path: the store's file.

    Returns:
        A `rewind.Store`.

    Raises:
        rewind.RewindError: (a ValueError) the file is not a rewind store, or is missing.
    """
    return Store(path)
