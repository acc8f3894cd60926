"""rewind's attention as operators for models under torch.compile.

The operators rewind::attention and rewind::attention_backward are defined in C++
(python/attention_ext.cpp: the BF16 path's two halves, rewind._C.attention_bf16_forward /
_backward, as CPU, CUDA and autograd kernels of the dispatcher); this module gives them fakes
(shapes and strides for tracing). dynamo puts them in its graph like any aten op (no graph
break), AOTAutograd traces the autograd kernel into the joint graph, and inductor calls them as
opaque kernels, without Python: a compiled model has the eager model's attention bits.

Which plan and layer an op runs is not an argument dynamo can see: `where` is a small CPU int64
tensor [source, layer] (a graph input, not a constant), read when the op runs. Every block of a
model then calls the same graph with its own `where`, so blocks compiled one by one share one
compiled frame instead of one per layer (past dynamo's recompile limit of 8 a frame runs
uncompiled), and a plan that changes between steps needs no recompile. `source` names a
rewind.instrument state or a fixed plan, registered with rewind._C, which also hears the
active plan whenever it changes.

Needs torch >= 2.4 (torch.library.register_fake); ensure() registers the fakes, defined() says
whether it has.
"""
import itertools
import sys
import weakref

import torch

from . import _C, _plan_state

_next_source = itertools.count(1)


def register_source(obj):
    """An id for `obj` that `where` tensors can carry: obj.plan is its plan, or None for the
    active one (read once: instrument's state and rewind.attention's plan= keep theirs). The
    id is forgotten when obj is."""
    sid = next(_next_source)
    _C.set_source(sid, obj.plan is None, obj.plan or "")
    weakref.finalize(obj, _C.drop_source, sid)
    return sid


# The C++ ops read the active plan from rewind._C: told now and on every change.
_C.set_active_plan(_plan_state.active)
_plan_state.listeners.append(_C.set_active_plan)


def where(source, layer):
    """The op's `where` argument for `layer` of `source`: int64 [source, layer] on the CPU (read
    on the host when the op runs, so a model on a GPU pays no device-to-host copy)."""
    return torch.tensor([source, layer], dtype=torch.int64)


def available():
    lib = getattr(torch, "library", None)
    return lib is not None and hasattr(lib, "register_fake")


def defined():
    return _ops is not None


def compiling():
    """Whether dynamo is tracing the caller (False on torch < 2.3, which has no such question)."""
    c = getattr(torch, "compiler", None)
    return c is not None and hasattr(c, "is_compiling") and c.is_compiling()


def traced_constant(fn):
    """fn, which dynamo calls while tracing and whose result it bakes into the graph (a pure
    function of constants: plan, shapes, layer)."""
    c = getattr(torch, "compiler", None)
    return c.assume_constant_result(fn) if c is not None and hasattr(c, "assume_constant_result") else fn


@traced_constant
def _bf16_ok(spec, heads, head_dim, layer):
    return _C.attention_bf16_ok(spec, heads, head_dim, layer)


def serves(q, k, v, spec, layer, ok=None):
    """Whether the operator runs this call while dynamo traces: BF16 q, k, v of one shape (a
    model under autocast) and a plan that promotes no attention op of the layer to FP32 (those
    take the eager op's FP32 path). Without a plan the layer is not read: nothing per layer
    becomes a constant of the trace; `ok`, the plan's answer for the layer where the caller
    keeps it (None: ask the plan, reading the layer)."""
    if not (compiling() and defined()):
        return False
    if not (q.dtype == torch.bfloat16 and k.dtype == q.dtype and v.dtype == q.dtype and
            q.shape == k.shape and q.shape == v.shape):
        return False
    return not spec or (ok if ok is not None else _bf16_ok(spec, q.shape[1], q.shape[3], layer))


class _Plan:
    """The source of rewind.attention's calls: a fixed plan, or the active one (None)."""

    def __init__(self, plan):
        self.plan = plan

    def spec(self):
        return _plan_state.active if self.plan is None else self.plan


_plans = {}  # plan (or None) -> (source id, _Plan), held for the process


@traced_constant
def plan_source(plan):
    """The source id of rewind.attention(..., plan=plan)'s calls."""
    if plan not in _plans:
        obj = _Plan(plan)
        _plans[plan] = (register_source(obj), obj)
    return _plans[plan][0]


def _eager_attention(q, k, v, spec, layer, causal):
    return _C.attention(q, k, v, spec, layer, causal)


# The eager op, for every call the operator does not serve (FP32 operands, a plan that promotes
# an attention op of the layer to FP32): under torch.compile it runs between two graphs.
_c = getattr(torch, "compiler", None)
eager_attention = _c.disable(_eager_attention) if _c is not None and hasattr(_c, "disable") else _eager_attention


def attention(q, k, v, w, causal):
    """O of rewind's BF16 attention through the operator (differentiable in q, k, v)."""
    return _ops(q, k, v, w, causal)[0]


def qkv_grad_strides(shape):
    """The strides of the backward's (3, B, H, T, D) result: a fused qkv projection's (B, T, 3, H,
    D) output gradient, of which dQ, dK, dV are views (kernels/attention_layout.h)."""
    _, _, h, t, d = shape
    c = h * d
    return (c, t * 3 * c, d, 3 * c, 1)


def _register():
    lib = torch.library

    @lib.register_fake("rewind::attention")
    def _(q, k, v, where, causal):
        b, h, t, d = q.shape
        return q.new_empty(q.shape), q.new_empty((b, h, t), dtype=torch.float32), q.new_empty((3, b, h, t, d))

    @lib.register_fake("rewind::attention_backward")
    def _(d_o, qkv, o, lse, where, causal):
        return qkv.new_empty_strided(qkv.shape, qkv_grad_strides(qkv.shape))

    return torch.ops.rewind.attention.default


def ensure():
    """Registers the ops' fakes (once) where torch can trace them. Not at the first call: that
    one may be inside dynamo's trace, which cannot register them. Called by rewind.instrument
    and rewind.record, and at import when dynamo is loaded already; registering them imports
    dynamo (~1.5 s), which a script that never compiles need not pay at `import rewind`."""
    global _ops
    if _ops is None and available():
        _ops = _register()
    return _ops is not None


_ops = None
if "torch._dynamo" in sys.modules:
    ensure()
