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

The public API is `rewind.__all__`; the modules whose names start with an underscore are
rewind's own plumbing (the CLI's replay, bisect and doctor protocols, data-parallel exchanges)
and may change without notice.
"""
from typing import Optional as _Optional

import torch  # noqa: F401  (loads LibTorch before the extension)

from . import _C, _compiled
from . import _serve  # noqa: F401  (notes the directory the script started in)
from ._instrument import instrument, instrumented, uninstrument
from ._mode import Mode, WindowDone
from ._ops import op
from ._plan_state import active_plan
from ._recording import Recorder, record
from ._store import Run, Store, open

__all__ = ["attention", "op", "instrument", "uninstrument", "instrumented", "record", "Recorder", "Mode",
           "WindowDone", "active_plan", "open", "Store", "Run", "RewindError"]
RewindError = _C.RewindError

for _public in (Recorder, Mode, WindowDone, Store, Run):
    _public.__module__ = __name__  # tracebacks and help() name them rewind.X, where users find them
del _public


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, plan: _Optional[str] = None, layer: int = 0,
              causal: bool = True, dropout_p: float = 0.0) -> torch.Tensor:
    """rewind's flash-attention emulation (CPU) or CUDA kernels (CUDA builds): a drop-in for
    F.scaled_dot_product_attention(q, k, v, is_causal=causal) whose rounding follows the
    precision plan's flags for `layer`. Differentiable in q, k and v.

    Args:
        q, k, v: (B, H, T, D) tensors of one dtype (BF16 under autocast goes to the kernels'
            BF16 entry points, FP32 to the FP32 path).
        plan: a plan such as "L0.H2.pv=fp32", "L*.H*.softmax=stable(beta=2)" or "L0.attn=fp32";
            None: rewind.active_plan(), the plan of the running rewind.record (and of `rewind
            replay --cmd --plan`).
        layer: the plan's layer whose flags apply.
        causal: causal masking, as SDPA's is_causal.
        dropout_p: must be 0: rewind's kernels have no attention dropout, and leaving it out
            silently would train another model than the user's.

    Returns:
        The attention output, (B, H, T, D), in q's dtype.

    Raises:
        rewind.RewindError: (a ValueError) dropout_p > 0, or a plan that does not parse or
            names a head the tensors lack.
        RuntimeError: q, k, v that are not (B, H, T, D) tensors the kernels take.
    """
    if dropout_p:
        raise RewindError(f"rewind.attention: dropout_p={dropout_p} is not supported (rewind's attention has no "
                          f"dropout); pass dropout_p=0 (e.g. dropout_p=0 when attn_pdrop is 0, or train without "
                          f"attention dropout) to use it")
    spec = active_plan() if plan is None else plan
    if _compiled.serves(q, k, v, spec, layer):  # under torch.compile: a custom op, no graph break
        return _compiled.attention(q, k, v, torch.tensor([_compiled.plan_source(plan), layer]), causal)
    return _compiled.eager_attention(q, k, v, spec, layer, causal)
