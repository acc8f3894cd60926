"""rewind from Python: rewind's attention as a differentiable PyTorch op, recording (and
replaying) a training loop of your own, and read access to rewind stores (runs, config,
per-step metrics, captured tensors, checkpoints, bisect reports).

    import rewind
    o = rewind.attention(q, k, v, plan="L0.H{1,3}.pv=fp32", layer=0)   # (B, H, T, D)
    with rewind.op("L0.mlp"): y = mlp(x)                              # FP32 where the plan says L0.mlp=fp32
    rec = rewind.record("run.db", model, optimizer, checkpoint_every=50)
    rewind.instrument(model)      # the same without editing the model (or record(..., instrument=True))
    run = rewind.open("run.db").runs[-1]
    run.steps()["loss"]
"""
import torch  # noqa: F401  (loads LibTorch before the extension)

from . import _C, compiled
from .instrument import instrument, instrumented, uninstrument
from .ops import op
from . import serve  # noqa: F401  (notes the directory the script started in)
from .recording import Recorder, active_plan, record
from .store import Run, Store, open

__all__ = ["attention", "op", "instrument", "uninstrument", "instrumented", "record", "Recorder", "active_plan",
           "open", "Store", "Run", "RewindError"]
RewindError = _C.RewindError


def attention(q, k, v, plan=None, layer=0, causal=True, dropout_p=0.0):
    """rewind's flash-attention emulation (CPU) or CUDA kernels (CUDA builds) on (B, H, T, D)
    tensors: a drop-in for F.scaled_dot_product_attention(q, k, v, is_causal=causal) whose
    rounding follows the precision plan's flags for `layer` (e.g. "L0.H2.pv=fp32",
    "L*.H*.softmax=stable(beta=2)", "L0.attn=fp32"). plan=None: rewind.active_plan(), the plan
    of the running rewind.record (and of `rewind replay --cmd --plan`). Differentiable in q, k
    and v; returns the dtype of q. Attention dropout is refused (dropout_p > 0 raises): rewind's
    kernels have none, and leaving it out silently would train another model than the user's."""
    if dropout_p:
        raise RewindError(f"rewind.attention: dropout_p={dropout_p} is not supported (rewind's attention has no "
                          f"dropout); pass dropout_p=0 (e.g. dropout_p=0 when attn_pdrop is 0, or train without "
                          f"attention dropout) to use it")
    spec = active_plan() if plan is None else plan
    if compiled.serves(q, k, v, spec, layer):  # under torch.compile: a custom op, no graph break
        return compiled.attention(q, k, v, torch.tensor([compiled.plan_source(plan), layer]), causal)
    return _C.attention(q, k, v, spec, layer, causal)
