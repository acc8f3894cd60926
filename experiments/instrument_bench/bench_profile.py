"""Where a variant's step time goes (bench.py --profile N): N more steps of each variant under
torch.profiler, after the timed ones, summed per kernel on the GPU. The medians of bench.py are
wall times between two synchronizations and carry the host's noise (launches, Python, the
machine); the kernels' own time per step is what the GPU spent, so the difference between two
variants' kernel sums says how much of their gap is work on the GPU and, per kernel group, whose.

Groups, by kernel name: attention (rewind's flash kernels, PyTorch's SDPA / cuDNN / FlashAttention
ones), gemm (cuBLAS, cuBLASLt, CUTLASS), triton (inductor's fused kernels), optimizer (foreach /
fused AdamW, clip), copy (memcpy, memset, layout copies), other.
"""
import re

import torch

GROUPS = (
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|cudnn_.*mha", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|nvjet|xmma|sm90_|matmul|cublas", re.I)),
    ("optimizer", re.compile(r"adam|foreach|multi_tensor|clip|norm_kernel", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|cat_|transpose|elementwise_kernel_with_index|qkv_layout|swap_middle", re.I)),
    ("triton", re.compile(r"^triton_", re.I)),
)


def group_of(name):
    for g, pat in GROUPS:
        if pat.search(name):
            return g
    return "other"


def profile_steps(variant, first_step, n, before=lambda: None):
    """Runs n steps of `variant` (bench.Variant) under the profiler from batch `first_step` on
    (batches reused cyclically; before() ahead of each step); returns {"wall_ms": per step,
    "kernels": {name: (us per step, calls per step)}, "host": the same for the CPU's operators
    (their self time)}, kernels being the GPU's kernels (the CPU's operators without a GPU)."""
    from torch.profiler import ProfilerActivity, profile
    on_gpu = variant.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    wall = 0.0
    with profile(activities=acts) as prof:
        for i in range(n):
            before()
            t, _ = variant.step((first_step + i) % len(variant.batches))
            wall += t
    kernels, host = {}, {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            if e.self_device_time_total > 0:
                kernels[e.key] = (e.self_device_time_total / n, e.count / n)
        elif e.self_cpu_time_total > 0:
            host[e.key] = (e.self_cpu_time_total / n, e.count / n)
    return {"wall_ms": 1e3 * wall / n, "kernels": kernels if on_gpu else host, "host": host, "gpu": on_gpu}


def summary(model, mode, profiles, top=12):
    """The text of one row's profiles: per variant the step's wall time, the kernels' sum and the
    groups; then the kernels whose time per step differs most from plain's (or the first
    variant's)."""
    names = list(profiles)
    what = "GPU kernels" if names and profiles[names[0]]["gpu"] else "CPU operators (no GPU)"
    lines = [f"## {model} {mode}: time per step in {what} (torch.profiler)"]
    groups = ["attention", "gemm", "triton", "optimizer", "copy", "other"]
    head = ["variant", "wall ms", "kernels ms", "launches"] + [f"{g} ms" for g in groups]
    rows = [head]
    for v in names:
        k = profiles[v]["kernels"]
        per_group = {g: 0.0 for g in groups}
        for name, (us, _) in k.items():
            per_group[group_of(name)] += us
        rows.append([v, f"{profiles[v]['wall_ms']:.3f}", f"{sum(us for us, _ in k.values()) / 1e3:.3f}",
                     f"{sum(c for _, c in k.values()):.0f}"] + [f"{per_group[g] / 1e3:.3f}" for g in groups])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    base = "plain" if "plain" in profiles else (names[0] if names else "")
    if len(names) > 1:
        for v in names:
            if v == base:
                continue
            a, b = profiles[base]["kernels"], profiles[v]["kernels"]
            diff = sorted(((b.get(n, (0, 0))[0] - a.get(n, (0, 0))[0], n) for n in set(a) | set(b)),
                          key=lambda x: -abs(x[0]))
            lines.append(f"-- {v} against {base}: the kernels whose time per step differs most (us, + = {v} slower)")
            for d, n in diff[:top]:
                calls = b.get(n, a.get(n, (0, 0)))[1]
                lines.append(f"  {d:+9.1f}  {calls:5.0f} calls  [{group_of(n)}] {n[:110]}")
    if len(names) > 1 and profiles[names[0]]["gpu"]:
        lines.append("-- host: each operator's own CPU time per step (us; the profiler's cost included), "
                     "those that differ most from " + base)
        for v in names:
            if v == base:
                continue
            a, b = profiles[base]["host"], profiles[v]["host"]
            total = sum(us for us, _ in b.values()) - sum(us for us, _ in a.values())
            lines.append(f"   {v}: {total:+.1f} us in all")
            diff = sorted(((b.get(n, (0, 0))[0] - a.get(n, (0, 0))[0], n) for n in set(a) | set(b)),
                          key=lambda x: -abs(x[0]))
            for d, n in diff[:top]:
                calls = b.get(n, a.get(n, (0, 0)))[1]
                lines.append(f"  {d:+9.1f}  {calls:5.0f} calls  {n[:110]}")
    return "\n".join(lines)
