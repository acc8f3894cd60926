"""rewind.op: a block of a user's model (an MLP, the attention module's linears, the LM head)
put under the precision plan, as rewind's own trainer puts its modules: where the active plan
promotes it (`L3.mlp=fp32`, `L*.mlp=fp32`, `L3=fp32`, `all=fp32`) the block runs in FP32,
elsewhere it runs as written.

    with rewind.op(f"L{i}.mlp"):         # autocast's BF16 casts off inside the block
        x = x + self.mlp(self.ln_2(x))
    y = rewind.op(f"L{i}.proj")(self.c_proj, y)   # also casts y to FP32 and the output back to y's dtype
"""
import re
from typing import Optional, Union

import torch

from . import _C, _compiled, _plan_state

_NAME = re.compile(r"(head|L[0-9]{1,4}\.(qkv|proj|mlp|ln|attn))")
_fp32_of = {}  # (plan, name) -> whether the plan promotes the block
_kMaxCached = 4096


class _AsWritten:
    """The block as written: entering, leaving and calling through it change nothing."""
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __call__(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)


_AS_WRITTEN = _AsWritten()


def _autocast_devices():
    """The device types whose autocast is on here (torch 1.13 and 2.x spell the query apart)."""
    out = []
    for dev in ("cpu", "cuda"):
        try:
            on = torch.is_autocast_enabled(dev)
        except TypeError:  # torch < 2.4: is_autocast_enabled() is CUDA's, CPU has its own
            on = torch.is_autocast_cpu_enabled() if dev == "cpu" else torch.is_autocast_enabled()
        if on:
            out.append(dev)
    return out


def _float32(x):
    return x.float() if torch.is_tensor(x) and x.is_floating_point() else x


class _Fp32:
    """The block in FP32: autocast off inside it, so its matmuls take FP32 operands and give FP32
    results where autocast would have rounded them to BF16 (the plan's `fp32`: nothing rounded)."""

    def __init__(self, name=""):
        self._name, self._off = name, []

    def __enter__(self):
        self._off = [torch.autocast(dev, enabled=False) for dev in _autocast_devices()]
        for ctx in self._off:
            ctx.__enter__()
        return self

    def __exit__(self, kind, value, tb):
        for ctx in reversed(self._off):
            ctx.__exit__(kind, value, tb)
        self._off = []
        if kind is RuntimeError and "dtype" in str(value):  # a BF16 input met an FP32 weight
            raise RuntimeError(f"rewind.op({self._name!r}) runs its block in FP32 (autocast off) and the block "
                               f"got a tensor of another dtype: call it as rewind.op({self._name!r})(fn, *args), "
                               "which casts the inputs to float32") from value
        return False

    def __call__(self, fn, *args, **kwargs):
        dtype = next((a.dtype for a in list(args) + list(kwargs.values())
                      if torch.is_tensor(a) and a.is_floating_point()), None)
        with _Fp32(self._name):
            out = fn(*[_float32(a) for a in args], **{k: _float32(v) for k, v in kwargs.items()})
        if dtype is None:
            return out
        if torch.is_tensor(out):
            return out.to(dtype) if out.is_floating_point() else out
        if isinstance(out, (tuple, list)):
            return type(out)(o.to(dtype) if torch.is_tensor(o) and o.is_floating_point() else o for o in out)
        return out


def op(name: str, *, plan: Optional[str] = None) -> Union[_AsWritten, _Fp32]:
    """The block of `name` under the precision plan: where the plan promotes the block, it
    computes in FP32 (autocast's BF16 casts off inside it); elsewhere, and always without a
    plan, it runs as written (no cast, no autocast change). Names the recording sees are
    stored with the run (kv "ops"), so `bisect --cmd` searches those module kinds.

        with rewind.op("L0.mlp", plan="L0.mlp=fp32"):
            y = mlp(x)
        y = rewind.op("L0.proj")(c_proj, y)   # the call form: casts the inputs too

    Args:
        name: "L<i>.mlp", "L<i>.qkv", "L<i>.proj", "L<i>.ln", "L<i>.attn" (the attention
            module's linears: promoted where the plan promotes both L<i>.qkv and L<i>.proj,
            e.g. `L3=fp32`) or "head" (final LayerNorm and LM head, `head=fp32`).
        plan: a fixed plan; None: rewind.active_plan(), the plan of the running rewind.record
            (and of `rewind replay|bisect --cmd`).

    Returns:
        A context manager for a `with` block, also callable as op(name)(fn, *args, **kwargs),
        which in FP32 casts the floating inputs to float32 and the output back to the first
        one's dtype (for blocks whose inputs are BF16).

    Raises:
        ValueError: `name` is no op name.
    """
    if name not in _plan_state.op_names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"rewind.op: {name!r} is no op name (expected L<layer>.qkv, .proj, .mlp, .ln, "
                             ".attn or head)")
        _plan_state.op_names.add(name)
    spec = _plan_state.active if plan is None else plan
    if not spec:
        return _AS_WRITTEN
    return _Fp32(name) if _promoted(spec, name) else _AS_WRITTEN


def decided(name, fp32):
    """What op(name) returns once the plan's answer for `name` is known."""
    return _Fp32(name) if fp32 else _AS_WRITTEN


@_compiled.traced_constant  # under torch.compile: a constant of the trace, not a graph break
def _promoted(spec, name):
    key = (spec, name)
    fp32 = _fp32_of.get(key)
    if fp32 is None:
        if len(_fp32_of) >= _kMaxCached:
            _fp32_of.clear()
        fp32 = _fp32_of[key] = _C.op_fp32(spec, name)
    return fp32
