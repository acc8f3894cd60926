"""rewind.instrument: a model put under the precision plan without editing its source. The
blocks are found by module path (an nn.ModuleList named h, layers or blocks: nanoGPT's
`transformer.h.<i>`, Hugging Face GPT-2's `transformer.h.<i>`, Llama's `model.layers.<i>`), the
layer index is the block's index there, and in each block

- its attention runs rewind's (the op rewind.attention calls, with the layer's plan flags): a
  Hugging Face model through transformers' attention registry (an implementation named
  "rewind"), any other model through a TorchFunctionMode, active only while the block's
  attention module runs, that takes over F.scaled_dot_product_attention;
- the attention module's linears are `L<i>.qkv` (c_attn, q_proj/k_proj/v_proj, ...) and
  `L<i>.proj` (c_proj, o_proj, ...), the MLP `L<i>.mlp`, the block's norms `L<i>.ln` and the
  root's lm_head `head`, each called through rewind.op's call form (FP32 where the plan promotes
  it, exactly as written elsewhere).

What it cannot map is refused with a one-line RewindError naming the module, never run another
way than the user's: attention with a mask, dropout, another scale, a hand-written softmax
(a block that ran no scaled_dot_product_attention), a block without recognizable linears.

    rewind.instrument(model)      # or rewind.record(..., instrument=True)
    rewind.uninstrument(model)    # the model as it was
"""
import math
import weakref
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from . import _C, _compiled, _ops, _plan_state

_LISTS = ("h", "layers", "blocks", "layer", "block")
_ATTN = ("attn", "self_attn", "attention", "self_attention")
_QKV = ("c_attn", "qkv", "qkv_proj", "Wqkv", "in_proj", "q_proj", "k_proj", "v_proj", "query", "key", "value")
_PROJ = ("c_proj", "o_proj", "out_proj", "proj", "dense")
_MLP = ("mlp", "feed_forward", "ffn")
_HEAD = ("lm_head",)

_SDPA = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0
_states = weakref.WeakKeyDictionary()      # model -> _State
# Set on attention modules; _rewind_ok, _rewind_fp32 (the linears') hold the plan's answers (_State.refresh).
_MARKS = ("_rewind_where", "_rewind_layer", "_rewind_path", "_rewind_state", "_rewind_shape", "_rewind_ok")
_HF_NAME = "rewind"


def _refuse(text):
    raise _C.RewindError("rewind.instrument: " + text)


def _is_hf(model):
    config = getattr(model, "config", None)
    return config is not None and hasattr(config, "_attn_implementation") and hasattr(model, "set_attn_implementation")


class _Mode(torch.overrides.TorchFunctionMode if hasattr(torch.overrides, "TorchFunctionMode") else object):
    """F.scaled_dot_product_attention inside an attention module, as rewind's attention for
    that module's layer. One per instrumented model: the module running now is an attribute
    (dynamo traces the mode and these writes; per-layer objects would be guarded one by one)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.module = None  # the attention module whose forward runs now

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            return self.state.sdpa(self.module, *args, **kwargs)
        return func(*args, **kwargs)


class _State:
    def __init__(self, model, plan):
        self.model, self.plan = model, plan
        self.calls = 0     # attention calls routed in the running attention module's forward
        self.hf = _is_hf(model)
        self.hf_before = None
        self.mapping = {}  # module path -> what it runs as ("L0.qkv", "L0 attention", ...)
        self.wrapped = []  # (module, the instance forward it had or None)
        self.marked = []   # attention modules given _rewind_* attributes
        self.ops = []      # (module, "L3.mlp", ...) of every wrapped linear
        self.seen = None   # the plan refresh() last answered for
        self.mode = _Mode(self)
        self.source = _compiled.register_source(self)
        _compiled.ensure()

    def spec(self):
        return _plan_state.active if self.plan is None else self.plan

    def refresh(self, spec):
        """The plan's answer for each module, kept on the module beside the plan it answers: does
        it promote this linear to FP32, does this attention take the BF16 kernels. Under
        torch.compile a block then guards on its answer, the same for every block the plan
        leaves alone, not on its layer: blocks compiled one by one share their graphs under a
        plan as without one. A module whose answer is for another plan asks the plan itself."""
        for module, name in self.ops:
            module.__dict__["_rewind_fp32"] = (spec, bool(spec) and bool(_ops._promoted(spec, name)))
        for attn in self.marked:
            shape = attn.__dict__.get("_rewind_shape")
            ok = True if not spec else None if shape is None else \
                bool(_C.attention_bf16_ok(spec, shape[0], shape[1], attn._rewind_layer))
            attn.__dict__["_rewind_ok"] = (spec, shape, ok)
        self.seen = spec

    def attention(self, module, q, k, v, causal, what):
        self.calls += 1
        if self.calls > 1:
            layer = module._rewind_layer
            _refuse(f"{module._rewind_path} ran {what} more than once in one forward; rewind maps one attention a "
                    f"block (layer {layer}): call rewind.attention(q, k, v, layer={layer}) for the one the plan means")
        spec = self.spec()
        if not _compiled.compiling() and module._rewind_shape != (q.shape[1], q.shape[3]):
            module.__dict__["_rewind_shape"] = (q.shape[1], q.shape[3])  # an eager call tells it
            self.refresh(spec)
        ok = None
        if spec:
            answer = module._rewind_ok
            if answer[0] == spec and answer[1] == (q.shape[1], q.shape[3]):
                ok = answer[2]
        # The layer is read only where no answer for this plan and shape is kept (a guard per layer).
        if _compiled.serves(q, k, v, spec, None if not spec or ok is not None else module._rewind_layer, ok):
            return _compiled.attention(q, k, v, module._rewind_where, causal)
        return _compiled.eager_attention(q, k, v, spec, module._rewind_layer, causal)

    def sdpa(self, module, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        # The module's path only where a refusal names it: read while dynamo traces, a string
        # per layer would be a guard per layer, and blocks compiled one by one would recompile.
        path = _Path(module)
        what = "F.scaled_dot_product_attention"
        if attn_mask is not None:
            _refuse(f"{path} calls {what} with an attn_mask, which rewind's attention does not take (causal or "
                    f"full only): pass is_causal=True and no mask, or call rewind.attention there")
        if dropout_p:
            _refuse(f"{path} calls {what} with dropout_p={dropout_p}, which rewind's attention does not have: "
                    f"set the model's attention dropout to 0 (nanoGPT: dropout=0.0) or call model.eval()")
        _check_scale(path, scale, q)
        k, v = _same_heads(path, q, k, v, enable_gqa)
        return self.attention(module, q, k, v, bool(is_causal), what)

    def hf_attention(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     is_causal=None, **kwargs):
        path = _Path(module)
        what = "its attention"
        if attention_mask is not None:
            _refuse(f"{path} got an attention mask (padding, packed sequences or a custom mask), which rewind's "
                    f"causal attention does not take: pass no attention_mask (or one of all ones)")
        if dropout:
            _refuse(f"{path} asks for attention dropout {dropout}, which rewind's attention does not have: build "
                    f"the model with attn_pdrop=0 / attention_dropout=0, or call model.eval()")
        for name in ("softcap", "sliding_window", "position_bias", "s_aux"):
            if kwargs.get(name) is not None:
                _refuse(f"{path} asks for {name}, which rewind's attention does not have")
        if getattr(module, "is_cross_attention", False):
            _refuse(f"{path} is cross-attention; rewind routes causal self-attention only")
        if query.shape[2] != key.shape[2]:
            _refuse(f"{path} attends {query.shape[2]} queries to {key.shape[2]} keys (a KV cache, generation); "
                    f"rewind's attention is for training steps: pass use_cache=False")
        _check_scale(path, scaling, query)
        groups = getattr(module, "num_key_value_groups", 1)
        if groups > 1:  # grouped-query attention: each K/V head repeated for its query heads
            key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
        o = self.attention(module, query, key, value, causal, what)
        return o.transpose(1, 2).contiguous(), None


class _Path:
    """An attention module's path, read from the module when a message is formatted."""
    __slots__ = ("module",)

    def __init__(self, module):
        self.module = module

    def __format__(self, spec):
        return format(self.module._rewind_path, spec)


def _check_scale(path, scale, q):
    want = 1.0 / math.sqrt(q.shape[-1])
    if scale is not None and abs(float(scale) - want) > 1e-6 * want:
        _refuse(f"{path} scales its attention logits by {float(scale):g}, rewind's attention by 1/sqrt(head_dim) "
                f"= {want:g} (e.g. GPT-2's scale_attn_by_inverse_layer_idx): build the model with the standard scale")


def _same_heads(path, q, k, v, enable_gqa):
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] and not enable_gqa:
        _refuse(f"{path}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; rewind's attention takes "
                f"(batch, heads, seq, head_dim) with one shape for all three")
    if k.shape[1] != q.shape[1]:
        if q.shape[1] % k.shape[1]:
            _refuse(f"{path}: {q.shape[1]} query heads over {k.shape[1]} key heads")
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    if q.shape[2] != k.shape[2]:
        _refuse(f"{path} attends {q.shape[2]} queries to {k.shape[2]} keys; rewind's attention takes one length")
    return k, v


def _wrap(state, module, forward):
    """module.forward replaced on the instance (its class untouched; uninstrument puts it back)."""
    state.wrapped.append((module, module.__dict__.get("forward")))
    module.forward = forward


def _op_forward(state, module, name, orig):
    def forward(*args, **kwargs):
        spec = _plan_state.active if state.plan is None else state.plan
        if not spec:  # no plan: as written (rewind.op's answer), and no guard on `name` under torch.compile
            return orig(*args, **kwargs)
        answer = module._rewind_fp32
        if answer[0] == spec:  # the plan's answer, kept by _State.refresh: no guard on `name` either
            return _ops.decided(name, answer[1])(orig, *args, **kwargs)
        return _ops.op(name, plan=spec)(orig, *args, **kwargs)
    return forward


def _attention_forward(state, module):
    """The attention module's forward: counts the attention calls it routes (exactly one), and
    for a model that is not Hugging Face's runs it under the TorchFunctionMode, so only the
    attention module's torch calls pay the mode's Python call, not the MLP's. Traced by dynamo
    (no graph break): it reads the module's tensors and writes attributes of one state."""
    own = module.__dict__.get("forward")
    fn = own if own is not None else type(module).forward
    call = (lambda *a, **kw: fn(*a, **kw)) if own is not None else (lambda *a, **kw: fn(module, *a, **kw))
    what = "its attention through transformers' attention registry" if state.hf else "F.scaled_dot_product_attention"

    def forward(*args, **kwargs):
        outer = state.calls
        state.calls = 0
        if state.hf:
            out = call(*args, **kwargs)
        else:
            mode = state.mode
            before, mode.module = mode.module, module
            with mode:
                out = call(*args, **kwargs)
            mode.module = before
        if state.calls == 0:
            layer = module._rewind_layer
            _refuse(f"{module._rewind_path} ran no {what} (a hand-written softmax attention?); rewind cannot "
                    f"route it: use F.scaled_dot_product_attention(q, k, v, is_causal=True) there, or "
                    f"rewind.attention(q, k, v, layer={layer}), or leave it uninstrumented")
        state.calls = outer
        return out
    return forward


def _blocks(model, blocks):
    if blocks is not None:
        found = dict(model.named_modules()).get(blocks)
        if not isinstance(found, torch.nn.ModuleList):
            _refuse(f"{type(model).__name__} has no nn.ModuleList at '{blocks}'")
        return blocks, found
    lists = [(n, m) for n, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) and n.rsplit(".", 1)[-1] in _LISTS]
    if len(lists) != 1:
        said = "found none" if not lists else "found " + ", ".join(n for n, _ in lists)
        _refuse(f"{type(model).__name__}: expected one nn.ModuleList of blocks named {', '.join(_LISTS)} "
                f"({said}): pass blocks='path.to.the.list'")
    return lists[0]


def _child(module, names):
    for n in names:
        m = getattr(module, n, None) if n in module._modules else None
        if m is not None:
            return n, m
    return None, None


def _map(model, state, blocks):
    """(module, path, op name) of every linear block, and (block, path, layer) of every block."""
    prefix, layers = _blocks(model, blocks)
    linears, found = [], []
    for i, block in enumerate(layers):
        path = f"{prefix}.{i}"
        an, attn = _child(block, _ATTN)
        if attn is None:
            _refuse(f"{path} ({type(block).__name__}) has no attention module named {', '.join(_ATTN)}; "
                    f"call rewind.attention and rewind.op in it instead")
        qkv = [(n, m) for n, m in attn.named_children() if n in _QKV]
        proj = [(n, m) for n, m in attn.named_children() if n in _PROJ]
        if not qkv or not proj:
            _refuse(f"{path}.{an} ({type(attn).__name__}) has no {'q/k/v' if not qkv else 'output'} linear named "
                    f"{', '.join(_QKV if not qkv else _PROJ)}; wrap its linears in rewind.op instead")
        mn, mlp = _child(block, _MLP)
        if mlp is None:
            _refuse(f"{path} ({type(block).__name__}) has no MLP named {', '.join(_MLP)}; wrap it in rewind.op instead")
        for n, m in qkv:
            linears.append((m, f"{path}.{an}.{n}", f"L{i}.qkv"))
        for n, m in proj:
            linears.append((m, f"{path}.{an}.{n}", f"L{i}.proj"))
        linears.append((mlp, f"{path}.{mn}", f"L{i}.mlp"))
        for n, m in block.named_children():
            if type(m).__name__.endswith("Norm"):  # LayerNorm, RMSNorm, LlamaRMSNorm, ...
                linears.append((m, f"{path}.{n}", f"L{i}.ln"))
        found.append((block, attn, path, f"{path}.{an}", i))
    hn, head = _child(model, _HEAD)
    if head is not None:
        linears.append((head, hn, "head"))
    return linears, found


def _hf_register():
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        _refuse(f"a Hugging Face model needs transformers' AttentionInterface and AttentionMaskInterface "
                f"(transformers >= 4.53): {e}")

    def rewind_attention(module, query, key, value, attention_mask, **kwargs):
        state = getattr(module, "_rewind_state", None)
        if state is None:
            raise _C.RewindError(f"attn_implementation='{_HF_NAME}' runs on models given to rewind.instrument; "
                                 f"{type(module).__name__} was not")
        return state.hf_attention(module, query, key, value, attention_mask, **kwargs)

    def rewind_mask(*args, attention_mask=None, **kwargs):
        # While tracing, transformers cannot look into position_ids for packed sequences and
        # builds an explicit causal mask, which rewind's attention would refuse. Without a
        # padding mask the rows are taken as one sequence each and the mask is causal: None, as
        # SDPA gets it in eager mode. Eager: sdpa_mask decides (a tensor is refused).
        if attention_mask is None and _compiled.compiling():
            return None
        return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)

    AttentionInterface.register(_HF_NAME, rewind_attention)
    AttentionMaskInterface.register(_HF_NAME, rewind_mask)


def _heads_of(attn):
    """(heads, head_dim) of an attention module as its attributes or config say them, None when
    they do not: a guess that the first call's q must confirm before its answer is used."""
    cfg = getattr(attn, "config", None)
    heads = next((h for h in (getattr(attn, a, None) for a in ("n_head", "num_heads", "num_attention_heads", "n_heads"))
                  if isinstance(h, int) and h > 0), getattr(cfg, "num_attention_heads", None))
    dim = getattr(attn, "head_dim", None)
    if not isinstance(dim, int) and isinstance(heads, int) and heads > 0:
        width = next((w for w in (getattr(attn, a, None) for a in ("n_embd", "embed_dim", "hidden_size"))
                      if isinstance(w, int)), getattr(cfg, "hidden_size", None))
        dim = width // heads if isinstance(width, int) and width % heads == 0 else None
    return (heads, dim) if isinstance(heads, int) and isinstance(dim, int) else None


def _plan_changed(spec):
    for state in list(_states.values()):
        if state.plan is None and state.seen != spec:
            state.refresh(spec)


_plan_state.listeners.append(_plan_changed)


def _unwrap(model):
    """The module whose forwards to wrap under DDP / DataParallel and torch.compile's wrappers,
    and whether a torch.compile wrapper was among them."""
    compiled = False
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(model, torch.nn.Module) and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model, compiled = model._orig_mod, True
        else:
            return model, compiled


def instrument(model: torch.nn.Module, *, plan: Optional[str] = None, blocks: Optional[str] = None) -> torch.nn.Module:
    """Routes `model`'s attention and linears through rewind's ops, in place: the plan's
    `L<i>.H<j>.<op>` flags reach the attention of block i, `L<i>.qkv|proj|mlp|ln` and `head`
    its modules, as in a model edited by hand with rewind.attention and rewind.op. A DDP or
    torch.compile wrapper is seen through (the model inside is instrumented; for a compiled one
    dynamo is reset, so the next call compiles the wrapped forwards afresh).

    Args:
        model: the model, or a DDP or torch.compile wrapper of it.
        plan: a fixed plan; None: the active plan (rewind.record's, a replay's or a bisect
            probe's) at each forward.
        blocks: the path of the nn.ModuleList of blocks ("encoder.stack") where it is not the
            one list named h, layers, blocks, layer or block.

    Returns:
        `model` itself (instrumenting an instrumented model returns it unchanged).

    Raises:
        rewind.RewindError: a model whose attention, linears or blocks rewind cannot map, or a
            torch without F.scaled_dot_product_attention (one line naming the module; nothing
            is left changed).
    """
    outer, model, compiled = model, *_unwrap(model)
    if model in _states:
        return outer
    state = _State(model, plan)
    if not state.hf and _SDPA is None:
        _refuse(f"torch {torch.__version__} has no F.scaled_dot_product_attention to take over; use "
                f"rewind.attention in the model")
    linears, found = _map(model, state, blocks)
    if state.hf:
        _hf_register()
    try:
        for module, path, name in linears:
            _wrap(state, module, _op_forward(state, module, name, module.forward))
            state.ops.append((module, name))
            state.mapping[path] = name
            # Known to rewind.op now, not at each module's first call: torch.compile guards on that
            # set's contents, and a set growing block by block recompiled every block's forward
            # past dynamo's recompile limit (the blocks then ran uncompiled).
            _plan_state.op_names.add(name)
        for block, attn, path, attn_path, layer in found:
            marks = {"_rewind_where": _compiled.where(state.source, layer), "_rewind_layer": layer,
                     "_rewind_path": attn_path, "_rewind_state": state, "_rewind_shape": _heads_of(attn),
                     "_rewind_ok": ("", None, True)}
            clash = [n for n in marks if n in attn.__dict__]
            if clash:
                _refuse(f"{attn_path} already has an attribute {clash[0]}; rewind.instrument names its own so")
            for n, value in marks.items():
                object.__setattr__(attn, n, value)
            state.marked.append(attn)
            _wrap(state, attn, _attention_forward(state, attn))
            state.mapping[attn_path] = f"L{layer} attention"
        if state.hf:
            state.hf_before = model.config._attn_implementation
            model.set_attn_implementation(_HF_NAME)
            if model.config._attn_implementation != _HF_NAME:
                _refuse(f"{type(model).__name__} did not take attn_implementation='{_HF_NAME}' (it does not "
                        f"use transformers' AttentionInterface)")
    except BaseException:
        _undo(state)
        raise
    _states[model] = state
    state.refresh(state.spec())
    if compiled:  # dynamo's guards see the new forwards too, but its stale entries would count
        torch._dynamo.reset()  # against the recompile limit, past which frames run uncompiled
    return outer


def _undo(state):
    for module, before in reversed(state.wrapped):
        if before is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = before
    state.wrapped = []
    for module, _ in state.ops:
        module.__dict__.pop("_rewind_fp32", None)
    state.ops = []
    for m in state.marked:
        for n in _MARKS:
            m.__dict__.pop(n, None)
    state.marked = []
    if state.hf_before is not None:
        state.model.set_attn_implementation(state.hf_before)
        state.hf_before = None


def uninstrument(model: torch.nn.Module) -> torch.nn.Module:
    """Undoes rewind.instrument: the model's own forwards and attention implementation again,
    bit for bit.

    Args:
        model: an instrumented model (or its DDP or torch.compile wrapper).

    Returns:
        `model` itself.

    Raises:
        rewind.RewindError: the model is not instrumented.
    """
    inner, compiled = _unwrap(model)
    state = _states.pop(inner, None)
    if state is None:
        _refuse(f"{type(inner).__name__} is not instrumented")
    _undo(state)
    if compiled:
        torch._dynamo.reset()
    return model


def instrumented(model: torch.nn.Module) -> Optional[Dict[str, str]]:
    """What rewind.instrument mapped.

    Args:
        model: a model (or its DDP or torch.compile wrapper).

    Returns:
        {module path: "L0.qkv" | "L0 attention" | "head" | ...}, or None for a model that is
        not instrumented.
    """
    state = _states.get(_unwrap(model)[0])
    return dict(state.mapping) if state else None
