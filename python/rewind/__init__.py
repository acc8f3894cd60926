"""rewind from Python: rewind's attention as a differentiable PyTorch op, and read access to
rewind stores (runs, config, per-step metrics, captured tensors, checkpoints, bisect reports).

    import rewind
    o = rewind.attention(q, k, v, plan="L0.H{1,3}.pv=fp32", layer=0)   # (B, H, T, D)
    run = rewind.open("run.db").runs[-1]
    run.steps()["loss"]
"""
import torch  # noqa: F401  (loads LibTorch before the extension)

from . import _C
from .store import Run, Store, open

__all__ = ["attention", "open", "Store", "Run", "RewindError"]
RewindError = _C.RewindError


def attention(q, k, v, plan="", layer=0, causal=True):
    """rewind's flash-attention emulation (CPU) or CUDA kernels (CUDA builds) on (B, H, T, D)
    tensors: a drop-in for F.scaled_dot_product_attention(q, k, v, is_causal=causal) whose
    rounding follows the precision plan's flags for `layer` (e.g. "L0.H2.pv=fp32",
    "L*.H*.softmax=stable(beta=2)", "L0.attn=fp32"). Differentiable in q, k and v; returns the
    dtype of q."""
    return _C.attention(q, k, v, plan, layer, causal)
