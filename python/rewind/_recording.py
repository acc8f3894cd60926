"""rewind.record: a user's own PyTorch training loop recorded into a rewind store (the format
rewind's trainer writes), and the same lines replaying a window of it when `rewind replay
--cmd "python3 train.py ..."` starts the script.

    rec = rewind.record("run.db", model, optimizer, checkpoint_every=50)
    for it in range(rec.start, max_iters):   # rec.start: 0, or the checkpoint a replay starts at
        x, y = rec.batch(get_batch, "train")  # recorded; a replay hands back the recorded batch
        loss = model(x, y)[1]; loss.backward(); optimizer.step(); optimizer.zero_grad()
        rec.step(loss=loss, grad_norm=norm, lr=lr)

A step is what runs between rec.batch and rec.step; a checkpoint at step s is the state before
step s runs (as in rewind's trainer)."""
from __future__ import annotations

import atexit
import json
import math
import os
import pickle
import sys
import time
from typing import Any, Callable, Mapping, Optional, Union

import torch

from . import _C, _compiled, _plan_state, _ranks, _serve
from ._batches import decode_batch, describe_batch, shapes_text, to_host
from ._doctor import Doctor
from ._mode import REPLAY_ENV, Launch, Mode, WindowDone
from ._plan_state import set_active_plan
from ._values import (_bytes_tensor, _f32_bits, _flatten, _one_line, _parameters, _plan_from_env, _queued_scalar,
                      _rng_state, _scalar, _schedule, _set_rng_state, _shape_difference, _unflatten, plan_at)

Scalar = Union[torch.Tensor, float, int, None]

_replaying = False  # a replayed process has made its recorder


_probe_t0 = time.perf_counter()  # when this process's probe began: `import rewind`, or serve's next run
_TIMES = {k: _C.timer(k) for k in ("probe", "record")}  # REWIND_TIMES=probe,record (docs/switches.md)


def begin_probe():
    """A served probe (_serve.py) starts: the script runs again in this process, and its
    rewind.record makes this process's recorder anew."""
    global _replaying, _probe_t0
    set_active_plan("")
    _replaying = False
    _probe_t0 = time.perf_counter()


def slow_head_note(model, devices=("cuda",)):
    """A one-line note where the model's output head will be slow for determinism's sake, not
    rewind's: a CUDA model under deterministic algorithms whose head (`lm_head`, or the last
    nn.Linear) has a number of outputs that is not a multiple of 8. Hugging Face's GPT-2
    (50257 outputs) spent 15.5 ms a step in its head's three GEMMs under deterministic
    algorithms against 2.4 ms without, on an H200, compiled, in plain PyTorch as under rewind
    (experiments/instrument_bench/results/h200_cxx_op.txt). None otherwise. `devices`: the
    device types it speaks for (a test passes the CPU's)."""
    if not torch.are_deterministic_algorithms_enabled():
        return None
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Linear):
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        head = linears[-1] if linears else None
    if head is None or head.weight.device.type not in devices or head.out_features % 8 == 0:
        return None
    return (f"rewind.record: the model's output layer has {head.out_features} outputs, not a multiple of 8: "
            f"under deterministic algorithms (which replay needs) PyTorch's GEMMs for it ran 6x slower "
            f"(GPT-2, H200); nanoGPT pads its vocabulary to 50304, a multiple of 64, and showed no such cost")


class Recorder:
    """What `rewind.record` returns: records each step of the loop into a new store, or, when
    rewind's CLI started the script, replays a window of a recording (`rewind replay|bisect
    --cmd`) or hashes the first steps (`rewind doctor --cmd`). Which of the three is `mode`,
    read once from the environment when the recorder is made. Use `start` as the loop's first
    iteration.

    Attributes:
        mode: a `rewind.Mode`: RECORD, REPLAY or DOCTOR.
        start: the loop's first step: the `start` given (0 by default) when recording, the
            checkpoint's step when a replay restores one.
        step_index: the step the loop runs next.
        run: the run's id in the store (recording and replay; None in a doctor's run).
        model, optimizer, state: what was given.
    """

    def __init__(self, path: Union[str, os.PathLike], model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 checkpoint_every: int = 50, plan: str = "", config: Optional[Mapping[str, Any]] = None,
                 state: Optional[Mapping[str, Any]] = None, plan_from: Optional[Mapping[int, str]] = None,
                 checkpoint_wait: bool = False, start: int = 0, monitor_every: int = 1):
        """Starts recording, replaying or doctoring, as the environment says; see
        `rewind.record`, which takes the same arguments (and `instrument`)."""
        if checkpoint_every < 1:
            raise ValueError("rewind.record: checkpoint_every must be at least 1")
        if int(monitor_every) < 1:
            raise ValueError("rewind.record: monitor_every must be at least 1")
        self.monitor_every = int(monitor_every)
        if int(start) < 0:
            raise ValueError("rewind.record: start must be >= 0")
        launch = Launch.from_environ()
        self.mode = launch.mode
        self._ranks = _ranks.world()  # None, or a data-parallel script's ranks (rank 0 writes the store)
        self._rank = self._ranks.rank if self._ranks else 0
        if self.mode is Mode.DOCTOR and self._ranks:
            raise _C.RewindError("rewind doctor runs the script as one process: start it without torchrun "
                                 "(one rank, the same per-rank batch)")
        self.model, self.optimizer = model, optimizer
        if "torch._dynamo" in sys.modules:  # torch.compile was called: its traces need the ops' fakes
            _compiled.ensure()
        self._params = list(model.parameters())  # digested every step: listed once
        self.state = dict(state or {})
        for name, obj in self.state.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"rewind.record: state[{name!r}] has no state_dict/load_state_dict")
        self.checkpoint_every = int(checkpoint_every)
        self.checkpoint_wait = bool(checkpoint_wait)
        self.step_index = int(start)  # the step the loop runs next (a recording's first: start)
        self._first_step = self.step_index
        self._pending = None      # (tensors, desc, rng, t0) between batch and step
        self._recorded_step = None  # a replay: the recorded step rec.batch returned the batch of
        self._closed = False
        self._done = None         # the WindowDone that ended a replay's or doctor's window
        self._ops_stored = 0      # how many rewind.op names the run's kv "ops" holds
        self._report = None
        self._plans = []          # a replay's asked plans: [(step, spec)]
        self._doctor = None
        self._rec = None          # the store's writer (rank 0 of a recording)
        self.run = None
        plan, plan_from = _plan_from_env(plan, plan_from)
        self._recorded_plan = _schedule(plan, plan_from)  # a replay's: the recording's
        if self.mode is Mode.DOCTOR:  # hash the first steps, record nothing
            self._doctor = Doctor(launch.spec, model, optimizer)
        elif self.mode is Mode.REPLAY:
            _serve.serve_if_asked(REPLAY_ENV, begin_probe, self._ranks)  # rewind bisect --cmd: returns unless serving
            self._begin_replay(launch.spec)
        else:
            self._begin_recording(str(path), self._recorded_plan, config or {})
        self.start = self.step_index

    @property
    def replaying(self) -> bool:
        """Whether this recorder replays a window (`mode is rewind.Mode.REPLAY`)."""
        return self.mode is Mode.REPLAY

    # --- recording -------------------------------------------------------------------------
    def _begin_recording(self, path, plan, config):
        meta = {"kind": "python", "script": sys.argv, "executable": sys.executable, "model": type(self.model).__name__,
                "parameters": _parameters(self.model), "torch": torch.__version__,
                "python": sys.version.split()[0], "threads": torch.get_num_threads(),
                "deterministic": torch.are_deterministic_algorithms_enabled(),
                "checkpoint_every": self.checkpoint_every, "monitor_every": self.monitor_every}
        params = list(self.model.parameters())
        meta["device"] = str(params[0].device) if params else "cpu"
        note = slow_head_note(self.model)
        if note and self._rank == 0:
            print(note, file=sys.stderr, flush=True)
        r = self._ranks
        if r:
            meta["world_size"] = r.size
            meta["device"] = params[0].device.type if params else "cpu"  # each rank's own
        self._rec, error = None, None
        if not r or r.root():
            try:
                self._rec = _C.ScriptRecording(path, json.dumps(config, default=str), plan, json.dumps(meta))
            except _C.RewindError as e:
                error = str(e)
        if self._rec:
            self._rec.set_params(self._params)
            self._rec.schedule_checkpoints(self.checkpoint_every, self.checkpoint_wait)
            self.run = self._rec.run
            atexit.register(self.close)  # commits what is queued if the script never calls close
        if r:  # rank 0's store (or its error) and which of the first LAG steps take a checkpoint, on every rank
            first = []
            if self._rec:  # (the first step always: a resumed loop's start need not fall on the schedule)
                first = [self._rec.checkpoint_due(self.step_index + i) or i == 0 for i in range(_ranks.LAG)]
            shared = r.all_objects((error, self._rec.run if self._rec else None, first))[0]
            error, self.run, self._first_checkpoints = shared
            self._desc = None  # the batches' description, the same on every rank and step
        if error:
            raise _C.RewindError(error)
        _C.set_monitoring(self._rec is not None)  # rank 0's monitors are recorded (its own heads)
        set_active_plan(plan_at(plan, 0))

    def _checkpoint(self, rng=None):
        """A checkpoint of the state before step_index; `rng`: every rank's generator states
        (Ranks.states), for a data-parallel recording."""
        t0 = time.perf_counter()
        tensors = []
        skeleton = {"model": _flatten("model", self.model.state_dict(), tensors),
                    "optimizer": _flatten("optimizer", self.optimizer.state_dict(), tensors),
                    "state": {k: _flatten(f"state/{k}", v.state_dict(), tensors) for k, v in self.state.items()},
                    "step": self.step_index}
        tensors.append(("skeleton", _bytes_tensor(pickle.dumps(skeleton, protocol=4))))
        tensors.append(("rng/cpu", torch.get_rng_state()))
        tensors.append(("rng/state", rng if torch.is_tensor(rng) else _bytes_tensor(_rng_state())))
        t1 = time.perf_counter()
        self._rec.put_checkpoint(self.step_index, tensors)
        if _TIMES["record"]:
            print(f"rewind: checkpoint at step {self.step_index}: state gathered in {1e3 * (t1 - t0):.1f} ms, "
                  f"handed to the writer in {1e3 * (time.perf_counter() - t1):.1f} ms", file=sys.stderr, flush=True)

    # --- replay ------------------------------------------------------------------------------
    def _begin_replay(self, spec):
        global _replaying
        if _replaying:
            raise _C.RewindError("rewind.record: a replay drives one recorder per process; this script made a second")
        _replaying = True
        self._times = [time.perf_counter()]  # rewind.record called; restored; each step's end
        self._report = open(spec["report"], "a", buffering=1)  # made by rewind; every rank may write an error
        self._to, self._from = int(spec["to"]), int(spec["from"])
        self._plans = [(int(s), p) for s, p in spec.get("plans", [])]
        self._stop_nonfinite = bool(spec.get("stop_nonfinite", False))
        try:
            self._restore(spec)
        except (_C.RewindError, RuntimeError, ValueError, KeyError) as e:
            self._fail(_one_line(e))
        self._times.append(time.perf_counter())
        self._write({"start": self.step_index, "run": self.run})

    def _restore(self, spec):
        self._replay = _C.ScriptReplay(spec["store"])
        run = self._replay.run(int(spec.get("run", 0)))
        self.run = run["id"]
        meta = json.loads(run["meta"])
        if meta.get("kind") != "python":
            raise _C.RewindError(f"run {self.run} was recorded by rewind train, not by rewind.record")
        ranks_here, ranks_then = self._ranks.size if self._ranks else 1, int(meta.get("world_size", 1))
        if ranks_here != ranks_then:
            raise _C.RewindError(f"run {self.run} was recorded on {ranks_then} rank(s) and this replay runs "
                                 f"{ranks_here}: start the script as it was recorded"
                                 + (f" (torchrun --nproc_per_node {ranks_then})" if ranks_then > 1
                                    else " (one process)"))
        recorded = meta.get("parameters", [])
        here = _parameters(self.model)
        if recorded != here:
            raise _C.RewindError(_shape_difference(recorded, here))
        c = self._replay.nearest_checkpoint(self.run, self._from)
        if c is None:
            raise _C.RewindError(f"run {self.run} has no checkpoint at or before step {self._from}")
        state = _serve.read_checkpoint(self._replay, spec["store"], self.run, c)
        skeleton = pickle.loads(state["skeleton"].numpy().tobytes())
        if _serve.serving() and not any(p.is_cuda for p in self._params):
            # The served checkpoint is shared by the probes; optimizer.load_state_dict keeps a CPU
            # tensor of the right dtype as it is (torch 2.x) and the step would write into it.
            state = {k: v.clone() if k.startswith(("optimizer/", "state/")) else v for k, v in state.items()}
        self.model.load_state_dict(_unflatten(skeleton["model"], state))
        self.optimizer.load_state_dict(_unflatten(skeleton["optimizer"], state))
        extra = skeleton.get("state", {})
        if sorted(extra) != sorted(self.state):
            raise _C.RewindError(f"rewind.record: state= names {sorted(self.state)} here, "
                                 f"{sorted(extra)} in the recording")
        for k, v in self.state.items():
            v.load_state_dict(_unflatten(extra[k], state))
        if _serve.serving():  # what torch.nn.init left as zeros must all have been restored
            _serve.end_skipped_init(self._state_tensors())
        _set_rng_state(_ranks.own_state(state["rng/state"].numpy().tobytes(), self._rank))
        self.step_index = int(skeleton["step"])
        self._recorded_plan = run["plan"]
        set_active_plan(self._plan_of(self.step_index))
        _C.set_monitoring(self._rank == 0)  # the per-head monitors go back with each step (a bisect's predicate)

    def _check_served(self, s, loss_v, digest):
        """A served probe's step under the recorded plan has the recorded bits, or the probe
        ends in one line: another command line, or a script that does not run again in this
        process as it ran on its own (state kept by a module between runs, or random draws of
        torch.nn.init, which served probes skip, that the script goes on to use)."""
        rec = self._recorded_step
        what = []
        if _f32_bits(loss_v) != rec["loss_bits"]:
            what.append("loss")
        if rec["digest"] and digest != rec["digest"]:
            what.append("parameter digest")
        if what:
            self._fail(f"step {s} of this served probe runs the recorded plan but its {' and '.join(what)} "
                       f"{'differ' if len(what) > 1 else 'differs'} from the recording's: the probe does not "
                       f"replay the recording (a command line other than the recorded one, or a script that "
                       f"does not run again in one process as on its own: bisect --script-per-probe, or "
                       f"REWIND_KEEP_INIT=1)")

    def _state_tensors(self):
        """Every tensor a checkpoint restores: the model's state_dict, the optimizer's state and
        the state= objects' tensors."""
        out = list(self.model.state_dict(keep_vars=True).values()) + list(self._params)
        for group in self.optimizer.state.values():
            out += [v for v in group.values() if torch.is_tensor(v)]
        for obj in self.state.values():
            out += [v for v in obj.state_dict().values() if torch.is_tensor(v)]
        return [t for t in out if torch.is_tensor(t)]

    def _fail(self, message):
        self._write({"error": message})
        raise _C.RewindError(message) from None

    def _write(self, obj):
        """A line of the replay's report: rank 0 reports the steps, any rank an error."""
        if self._rank != 0 and "error" not in obj:
            return
        # NaN and Inf are no JSON: null (the loss and grad norm travel as their bits too).
        def finite(v):
            if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
                return None
            return {k: finite(x) for k, x in v.items()} if isinstance(v, dict) else v
        self._report.write(json.dumps(finite(obj)) + "\n")

    def _plan_of(self, step):
        """The plan step `step` runs under: the recorded one, or during a replay from the first
        of the asked plans' step on, the last of them whose step <= `step`."""
        asked = [p for s, p in self._plans if s <= step]
        return asked[-1] if asked else plan_at(self._recorded_plan, step)

    def _replay_batch(self):
        s = self.step_index
        rec = self._replay.step(self.run, s)
        if rec is None:
            self._fail(f"run {self.run} has no recorded step {s}")
        batch = decode_batch(rec, rank=self._rank)
        _set_rng_state(_ranks.own_state(rec["rng"], self._rank))
        self._recorded_step = rec
        return batch

    # --- the loop's two calls -----------------------------------------------------------------
    def batch(self, get_batch: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Starts a step and returns its batch.

        Args:
            get_batch: the loop's own batch source, called as get_batch(*args, **kwargs); it
                returns a tensor, a tuple or list of tensors, or a dict of them with string keys.
            *args, **kwargs: passed to get_batch.

        Returns:
            What get_batch returned (recorded with the step). In a replay get_batch is not
            called: the recorded batch comes back, on the recorded device, and the generators
            are set to what they were after it.

        Raises:
            rewind.WindowDone: a replay's window or a doctor's steps have all run (the script
                ends with status 0 unless it catches it).
            rewind.RewindError: the step already has its batch, or a replay's recording lacks
                this step.
            TypeError: get_batch returned something else than tensors.
        """
        if self._done is not None:
            raise self._window_done()
        if self._pending is not None:
            raise _C.RewindError(f"rec.batch: step {self.step_index} already has its batch; call rec.step first")
        t0 = time.perf_counter()
        set_active_plan(self._plan_of(self.step_index))
        _C.set_sr_step(self.step_index)  # an sr head's random bits: this step's, in a replay too
        if self.mode is Mode.DOCTOR:
            out = get_batch(*args, **kwargs)  # the script's own source: is it the same twice?
            self._doctor.begin_step(self.step_index, out)
            self._pending = (None, None, None, t0)
            return out
        if self.mode is Mode.REPLAY:
            if self.step_index > self._from and not self._ranks and _serve.stop_asked():
                self._end_window(self.step_index - 1)  # told to stop while it ran its last step
            out = self._replay_batch()
            _C.collect_monitors()  # drops what ran outside a step (e.g. an evaluation)
            self._pending = (None, None, None, t0)
            return out
        if self._ranks:
            return self._batch_of_ranks(get_batch, args, kwargs, t0)
        # (the first step always: a resumed loop's start need not fall on the schedule)
        if self._rec.checkpoint_due(self.step_index) or self.step_index == self._first_step:
            self._checkpoint()  # written after the steps queued before it
        self._monitor_this_step()  # and drops what ran outside a step (e.g. an evaluation)
        out = get_batch(*args, **kwargs)
        tensors, desc = describe_batch(out, str)
        self._pending = ([to_host(t) for t in tensors], desc, _rng_state(), t0)
        return out

    def _batch_of_ranks(self, get_batch, args, kwargs, t0):
        """rec.batch of a data-parallel recording (_ranks.py): every rank's batch and generators
        go to rank 0, which records them as the step's; no rank's host waits for another's."""
        r, s = self._ranks, self.step_index
        device = self._params[0].device if self._params else torch.device("cpu")
        due = self._first_checkpoints[s - self._first_step] if s - self._first_step < _ranks.LAG else r.decision(s)
        if due:  # rank 0's decision, LAG steps ago
            before = r.states(_rng_state(), device)  # every rank's generators before the step
            if r.root():
                self._checkpoint(before)
        self._monitor_this_step()
        out = get_batch(*args, **kwargs)
        tensors, desc = describe_batch(out, lambda d: d.type)  # cuda:1 on rank 1 is its cuda
        if self._desc is None:  # the first step: every rank's description, once (a host exchange)
            for i, d in enumerate(r.all_objects(desc)):
                if d != desc:
                    raise _C.RewindError(f"rec.batch: step {s}'s batch is {shapes_text(d)} on rank {i} and "
                                         f"{shapes_text(desc)} on rank {r.rank}; a data-parallel recording "
                                         f"needs batches of one shape on every rank")
            self._desc = desc
        elif desc != self._desc:
            raise _C.RewindError(f"rec.batch: step {s}'s batch is {shapes_text(desc)} on rank {r.rank}, "
                                 f"{shapes_text(self._desc)} before; a data-parallel recording needs "
                                 f"batches of one shape on every rank and step")
        rng = r.states(_rng_state(), device, r.root() and self._rec.checkpoint_due(s + _ranks.LAG))
        r.keep_decision(rng, s + _ranks.LAG)
        stacks = r.stack(tensors)  # (world size, ...) each
        if r.root():  # the step writer reads the stacks once the device has them
            self._pending = ([to_host(t) for t in stacks], {**desc, "ranks": r.size}, rng, t0)
        else:
            self._pending = (None, None, None, t0)
        return out

    def _monitor_this_step(self):
        """Recording: rewind.attention collects its per-head monitors in this step only on
        steps 0, monitor_every, 2 monitor_every, ... (rank 0's), and drops what it collected
        before (outside a step)."""
        _C.set_monitoring(self._rec is not None and self.step_index % self.monitor_every == 0)

    def step(self, loss: Scalar, *, grad_norm: Scalar = None, lr: Optional[float] = None, **metrics: Scalar) -> None:
        """Ends the step begun by `rec.batch`; call it after optimizer.step().

        Recording, the step stores the loss and gradient norm (as FP32 bits), the learning
        rate, a digest of the parameters, the keyword scalars and the per-head monitors of the
        rewind.attention calls since rec.batch ("L0.H1.max_logit", "repmax_rate", "pbar_one",
        "stable_guard"). In a replay they go to `rewind replay` instead; in a doctor's run the
        step's loss and parameters are hashed.

        Args:
            loss: the step's loss, a one-element tensor or a number (None: NaN).
            grad_norm: the gradient norm, as loss (None: NaN).
            lr: the learning rate (None: the optimizer's first parameter group's).
            **metrics: more scalars stored under their names (one-element tensors or numbers).

        Raises:
            rewind.WindowDone: the step was the last one a replay's window or a doctor's run
                needs (the script ends with status 0 unless it catches it).
            rewind.RewindError: no rec.batch began the step, or a background write failed.
            ValueError: a tensor given is not a scalar.
        """
        if self._done is not None:
            raise self._window_done()
        if self._pending is None:
            raise _C.RewindError(f"rec.step: step {self.step_index} has no batch; call rec.batch first")
        tensors, desc, rng, t0 = self._pending
        self._pending = None
        if self.mode is Mode.RECORD:
            self._record_step(t0, tensors, desc, rng, loss, grad_norm, lr, metrics)
        elif self.mode is Mode.DOCTOR:
            s = self.step_index
            self.step_index += 1
            if self._doctor.end_step(s, _scalar(loss, "loss")):
                self._end_window(s)
        else:
            self._replay_step(t0, loss, grad_norm, lr, metrics)

    def _record_step(self, t0, tensors, desc, rng, loss, grad_norm, lr, metrics):
        if not self._rec:  # another rank than 0 of a recording
            self.step_index += 1
            return
        seconds = time.perf_counter() - t0
        lr_v = float(self.optimizer.param_groups[0]["lr"] if lr is None else lr)
        scalars = [("loss", _queued_scalar(loss, "loss")), ("grad_norm", _queued_scalar(grad_norm, "grad_norm"))]
        scalars += [(k, _queued_scalar(v, k)) for k, v in metrics.items()]
        ops = ""
        if len(_plan_state.op_names) != self._ops_stored:
            ops, self._ops_stored = json.dumps(sorted(_plan_state.op_names)), len(_plan_state.op_names)
        # Queued, not written: the step writer waits for the device's copies (rewind._C).
        self._rec.queue_step(self.step_index, lr_v, seconds, scalars, tensors, rng,
                             json.dumps({"batch": desc, "seconds": seconds}), ops, torch.cuda.is_initialized())
        self.step_index += 1

    def _replay_step(self, t0, loss, grad_norm, lr, metrics):
        """A replayed step reported to rewind; the window ends after its last step, at a NaN
        loss where the probe asked for that, or where a served probe's verdict is decided."""
        loss_v, norm_v = _scalar(loss, "loss"), _scalar(grad_norm, "grad_norm")
        lr_v = float(self.optimizer.param_groups[0]["lr"] if lr is None else lr)
        digest = _C.param_digest_queued(self._params)() if self._rank == 0 else ""  # as recorded
        s = self.step_index
        self.step_index += 1
        scalars = [(k, _scalar(v, k)) for k, v in metrics.items()] + _C.collect_monitors()
        seconds = time.perf_counter() - t0
        if _serve.serving() and self._rank == 0 and self._plan_of(s) == plan_at(self._recorded_plan, s):
            self._check_served(s, loss_v, digest)
        self._write({"step": s, "loss": loss_v, "loss_bits": _f32_bits(loss_v), "grad_norm": norm_v,
                     "grad_norm_bits": _f32_bits(norm_v), "lr": lr_v, "digest": digest,
                     "seconds": seconds, "metrics": dict(scalars)})
        stop = self._stop_nonfinite and s >= self._from and not math.isfinite(loss_v)
        # A served bisect probe whose verdict rewind has decided on the steps so far ends here.
        asked = s >= self._from and _serve.stop_asked()
        if self._ranks:  # the ranks end together, where rank 0 says so (its loss, its probe's reader)
            stop, asked = divmod(self._ranks.flag(2 * stop + asked), 2)
        if stop:  # a bisect probe: NaN/Inf stays so, the rest of the window cannot change it
            self._write({"stopped": s})
        self._times.append(time.perf_counter())
        if s >= self._to or stop or asked:
            self._end_window(s)

    def _end_window(self, last):
        """The end of a replay's window or a doctor's steps after step `last`: reported, and
        WindowDone raised, which ends the script unless it catches it."""
        if self.mode is Mode.REPLAY:
            if _TIMES["probe"]:  # where a probe's wall goes (served: from serve's start of the run)
                t = self._times
                print(f"rewind: probe times: script to rewind.record {t[0] - _probe_t0:.3f} s, restore "
                      f"{t[1] - t[0]:.3f} s, {len(t) - 2} steps {t[-1] - t[1]:.3f} s (first "
                      f"{t[min(2, len(t) - 1)] - t[1]:.3f} s)", file=sys.stderr, flush=True)
            self._write({"done": last})
            self._report.close()
        self._done = last
        raise self._window_done()

    def _window_done(self):
        return WindowDone(self.mode, self._done)

    def close(self) -> None:
        """Ends the recording: waits until every step and checkpoint is committed (the store's
        background writers) and lets go of the store's writer lock. Called at exit if the
        script does not; a second call, and a call in a replay or a doctor's run, does nothing.

        Raises:
            rewind.RewindError: a background write failed.
        """
        if self.mode is Mode.RECORD and not self._closed and self._rec:
            self._closed = True
            _C.set_monitoring(False)
            late, folded, max_late, pending = self._rec.checkpoint_lateness()
            self._rec.close()
            said = []
            if late:  # as rewind train says it
                said.append(f"{late} checkpoint(s) taken late, by up to {max_late} step(s), because the writer was "
                            f"busy ({folded} more due ones folded into them)")
            if pending >= 0:
                said.append(f"the checkpoint due at step {pending} was not taken: the loop ended while the writer "
                            f"was busy")
            if said:
                print(f"rewind.record: {'; '.join(said)}; checkpoint_wait=True keeps them exactly "
                      f"{self.checkpoint_every} apart instead", file=sys.stderr)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def record(path: Union[str, os.PathLike], model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
           checkpoint_every: int = 50, plan: str = "", config: Optional[Mapping[str, Any]] = None,
           state: Optional[Mapping[str, Any]] = None, plan_from: Optional[Mapping[int, str]] = None,
           checkpoint_wait: bool = False, start: int = 0, monitor_every: int = 1,
           instrument: bool = False) -> Recorder:
    """Records the training loop of `model` and `optimizer` into a new store at `path`, or,
    when rewind's CLI started this script, replays the asked window from the recording
    (`rewind replay|bisect --cmd`) or hashes the first steps (`rewind doctor --cmd`) instead:
    the returned recorder's `mode`.

        rec = rewind.record("run.db", model, optimizer, checkpoint_every=50)
        for it in range(rec.start, max_iters):
            x, y = rec.batch(get_batch, "train")
            ...
            rec.step(loss=loss, grad_norm=norm, lr=lr)

    Args:
        path: the new store (never overwritten: an existing non-empty file is refused).
            Ignored in a replay, which reads the store rewind names.
        model, optimizer: the loop's; their state_dicts are checkpointed and restored.
        checkpoint_every: model and optimizer state_dicts and the generators' states every
            that many steps. A checkpoint that falls due while the one before is still being
            compressed and written is taken at the first later step where the writer has room
            (the loop does not wait; `rewind train` does the same).
        plan: the precision plan rewind.attention and rewind.op apply (recorded with the run).
            REWIND_PLAN in the environment replaces it.
        config: a JSON-able dict stored as the run's config (e.g. nanoGPT's config dict).
        state: more objects whose state_dict() the checkpoints keep and a replay restores, by
            name, e.g. {"scaler": scaler, "sched": lr_scheduler}.
        plan_from: {step: spec}, plans applied on top of `plan` from those steps on (as rewind
            train --plan-from), e.g. {20: "L1.H0.pv=fault(strength=25600)"} to plant a fault
            for a test. REWIND_PLAN_FROM='20:L1.H0.pv=fault(strength=25600)' (several joined
            by '|') in the environment adds changes.
        checkpoint_wait: wait for the writer instead, for checkpoints at exactly 0, K, 2K, ...
        start: the number of the first step recorded, for a loop resumed from its own
            checkpoint (nanoGPT's iter_num after --init_from=resume): steps and checkpoints
            keep the run's numbering.
        monitor_every: the per-head monitors of rewind.attention are recorded on steps 0, N,
            2N, ... only (recorded with the run); the other steps skip their counts, about a
            fifth of the attention forward on an H200. Replays report them on every step.
        instrument: rewind.instrument(model) first, so an unedited model's attention and
            linears follow the plan (a model it cannot map is refused before anything is
            recorded).

    Returns:
        The `rewind.Recorder` whose `batch` and `step` the loop calls.

    Raises:
        rewind.RewindError: the store cannot be made (a non-empty file is there), a replay
            cannot restore the recording into this model, or the environment rewind's
            CLI sets is malformed.
        ValueError: checkpoint_every or monitor_every below 1, or a negative start.
        TypeError: a state= object without state_dict/load_state_dict.
    """
    if instrument:
        from ._instrument import instrument as instrument_model
        instrument_model(model)
    return Recorder(path, model, optimizer, checkpoint_every=checkpoint_every, plan=plan, config=config, state=state,
                    plan_from=plan_from, checkpoint_wait=checkpoint_wait, start=start, monitor_every=monitor_every)
