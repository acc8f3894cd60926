"""What rewind.record stores, as values: scalars as their FP32 bits, every generator's state,
a state_dict as named tensors and a skeleton, the model's parameter list, and the plan over the
steps (the recorded schedule and rewind's own environment on top of the script's plan), and an
exception as the one line a refusal prints."""
import json
import os
import pickle
import random
import struct
import sys

import torch

from . import _C


def plan_at(recorded, step):
    """The plan of `step` in a run's recorded plan: a plain spec, or a schedule (JSON {"base":
    spec, "changes": [[step, spec], ...]}, as rewind train --plan-from and rewind.record's
    plan_from write it) whose changes apply on top of the base from their step on."""
    try:
        schedule = json.loads(recorded) if recorded.startswith("{") else None
    except ValueError:
        schedule = None
    if not isinstance(schedule, dict):
        return recorded
    parts = [schedule.get("base", "")] + [spec for s, spec in schedule.get("changes", []) if s <= step]
    return ";".join(p for p in parts if p)


def _f32_bits(value):
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _scalar(x, name):
    if x is None:
        return float("nan")
    if torch.is_tensor(x):
        if x.numel() != 1:
            raise ValueError(f"rec.step: {name} must be a scalar, not a tensor of shape {tuple(x.shape)}")
        x = x.detach().float().item()
    return float(x)


def _queued_scalar(x, name):
    """A scalar of rec.step as queue_step takes it: a one-element tensor (read by the step writer
    once the device is done with it) or a float."""
    if torch.is_tensor(x):
        if x.numel() != 1:
            raise ValueError(f"rec.step: {name} must be a scalar, not a tensor of shape {tuple(x.shape)}")
        return x.detach()
    return float("nan") if x is None else float(x)


def _rng_state():
    """Every generator a loop may draw from: Python's, NumPy's (when imported), torch's CPU and
    CUDA ones, pickled."""
    state = {"python": random.getstate(), "cpu": torch.get_rng_state().numpy().tobytes()}
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [t.numpy().tobytes() for t in torch.cuda.get_rng_state_all()]
    return pickle.dumps(state, protocol=4)


def _set_rng_state(blob):
    state = pickle.loads(blob)
    random.setstate(state["python"])
    torch.set_rng_state(torch.frombuffer(bytearray(state["cpu"]), dtype=torch.uint8))
    if "numpy" in state:
        import numpy
        numpy.random.set_state(state["numpy"])
    for i, cuda in enumerate(state.get("cuda", [])):
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(cuda), dtype=torch.uint8), i)


def _flatten(prefix, obj, out):
    """A state_dict as named tensors (appended to `out`) and a skeleton holding the rest."""
    if torch.is_tensor(obj):
        out.append((prefix, obj.detach()))
        return {"__rewind_tensor__": prefix}
    if isinstance(obj, dict):
        return type(obj)((k, _flatten(f"{prefix}/{k}", v, out)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_flatten(f"{prefix}/{i}", v, out) for i, v in enumerate(obj))
    return obj


def _unflatten(skeleton, tensors):
    if isinstance(skeleton, dict):
        if set(skeleton) == {"__rewind_tensor__"}:
            return tensors[skeleton["__rewind_tensor__"]]
        return type(skeleton)((k, _unflatten(v, tensors)) for k, v in skeleton.items())
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_unflatten(v, tensors) for v in skeleton)
    return skeleton


def _bytes_tensor(b):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8) if b else torch.zeros(0, dtype=torch.uint8)


def _parameters(model):
    return [[n, list(p.shape), str(p.dtype).replace("torch.", "")] for n, p in model.named_parameters()]


def _shape_difference(recorded, here):
    rec, now = {p[0]: p for p in recorded}, {p[0]: p for p in here}
    for name in list(rec) + list(now):
        if name not in now:
            return f"the model has no parameter '{name}', which the recording has"
        if name not in rec:
            return f"the model's parameter '{name}' is not in the recording"
        if rec[name] != now[name]:
            return (f"the model's parameter '{name}' is {now[name][1]} {now[name][2]} here, "
                    f"{rec[name][1]} {rec[name][2]} in the recording")
    return "the model's parameters are in another order than in the recording"


PLAN_ENV, PLAN_FROM_ENV = "REWIND_PLAN", "REWIND_PLAN_FROM"


def _plan_from_env(plan, plan_from):
    """The recording's plan and changes with rewind's own environment on top: REWIND_PLAN
    replaces `plan`, REWIND_PLAN_FROM ("STEP:SPEC", several joined by '|') adds changes (a later
    one at the same step wins), so a plan or a planted fault reaches a script unchanged, without
    its argument parser. Said on stderr, since the run then records another plan than its code's."""
    env_plan, env_from = os.environ.get(PLAN_ENV), os.environ.get(PLAN_FROM_ENV)
    if env_plan is None and not env_from:
        return plan, plan_from
    plan_from = dict(plan_from or {})
    if env_plan is not None:
        plan = env_plan
    for item in (env_from or "").split("|"):
        if not item.strip():
            continue
        step, sep, spec = item.partition(":")
        if not sep or not step.strip().isdigit() or not spec.strip():
            raise _C.RewindError(f"{PLAN_FROM_ENV}: expected STEP:SPEC (several joined by '|'), got '{item}'")
        plan_from[int(step)] = spec.strip()
    said = ([f"{PLAN_ENV}='{plan}'"] if env_plan is not None else []) + ([f"{PLAN_FROM_ENV}='{env_from}'"] if env_from else [])
    print(f"rewind: recording with {' and '.join(said)} from the environment", file=sys.stderr)
    return plan, plan_from


def _schedule(plan, plan_from):
    """The recorded plan text: `plan`, or with plan_from ({step: spec}) the schedule JSON that
    rewind train --plan-from writes (train/plan_schedule.h)."""
    if not plan_from:
        return plan
    changes = sorted([int(s), str(spec)] for s, spec in plan_from.items())
    if changes[0][0] < 0:
        raise ValueError("rewind.record: plan_from steps must be >= 0")
    return json.dumps({"base": plan, "changes": changes})


def _one_line(e):
    """An exception as one line: load_state_dict's start on a second line, a KeyError is a key."""
    if isinstance(e, KeyError):
        return f"the recording lacks {e}"
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(e).__name__
