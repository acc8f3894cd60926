"""Host time of one call of rewind's compiled attention operators, on tiny operands so that the
math is small: rewind::attention and rewind::attention_backward called as inductor calls them
(torch.ops), against the same C++ halves called directly (rewind._C; the difference is the
operator's dispatch), and PyTorch's own SDPA operator. What a compiled graph pays per attention
call on the host beyond the work itself.

  PYTHONPATH=build-torch2/python python3 experiments/instrument_bench/op_host.py [--calls N]
"""
import argparse
import time

import torch

import rewind
from rewind import _C, _compiled


def per_call_us(fn, calls):
    for _ in range(calls // 10):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    if not _compiled.ensure():
        raise SystemExit(f"torch {torch.__version__} cannot trace rewind's operators (needs torch >= 2.4)")
    d = 32 if a.device.startswith("cuda") else 16  # the CUDA kernels' smallest head dim
    q = torch.randn(1, 1, 8, d, device=a.device).bfloat16()
    k, v = q.clone(), q.clone()
    w = _compiled.where(_compiled.plan_source(None), 0)
    fwd, bwd = torch.ops.rewind.attention.default, torch.ops.rewind.attention_backward.default
    o, lse, qkv = fwd(q, k, v, w, True)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    pairs = [
        ("forward", lambda: fwd(q, k, v, w, True), lambda: _C.attention_bf16_forward(q, k, v, "", 0, True)),
        ("backward", lambda: bwd(o, qkv, o, lse, w, True),
         lambda: _C.attention_bf16_backward(o, qkv, o, lse, "", 0, True)),
    ]
    print(f"host us per call, {a.calls} calls, (1, 1, 8, {d}) BF16 on {a.device}, torch {torch.__version__}")
    print(f"{'':10s} {'torch.ops':>10s} {'rewind._C':>10s} {'ops - _C':>9s} {'ops / _C':>9s}")
    with torch.no_grad():  # as a compiled graph runs its forward
        for name, op, direct in pairs:
            t_op, t_c = per_call_us(op, a.calls), per_call_us(direct, a.calls)
            sync()
            print(f"{name:10s} {t_op:10.1f} {t_c:10.1f} {t_op - t_c:9.1f} {t_op / t_c:9.2f}")
        sdpa = per_call_us(lambda: torch.ops.aten.scaled_dot_product_attention.default(q, k, v, is_causal=True),
                           a.calls)
        print(f"{'SDPA fwd':10s} {sdpa:10.1f}")


if __name__ == "__main__":
    main()
