"""The batches of rewind.record: what get_batch returned, as tensors queued to the host and a
description (how to rebuild it, each tensor's dtype, shape and device), and back. A data-parallel
recording keeps each tensor as the stack of every rank's (_ranks.py); decode_batch takes one
rank's slice."""
import json

import torch


def to_host(t):
    """A copy of tensor t on the host, queued: from a GPU into pinned memory without waiting
    (the copy runs when the device gets there; the step writer reads it after the step's work)."""
    t = t.detach()
    if not t.is_cuda:
        return t.clone()
    h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    h.copy_(t, non_blocking=True)
    return h


def batch_tensors(out):
    """The tensors of what get_batch returned and how to rebuild it (rebuild_batch): a tensor,
    a tuple or list of tensors, or a dict of them with string keys (as a Hugging Face collator)."""
    if torch.is_tensor(out):
        return [out], {"kind": "tensor"}
    if isinstance(out, (tuple, list)) and out and all(torch.is_tensor(t) for t in out):
        return list(out), {"kind": type(out).__name__}
    if isinstance(out, dict) and out and all(isinstance(k, str) and torch.is_tensor(v) for k, v in out.items()):
        return list(out.values()), {"kind": "dict", "keys": list(out)}
    raise TypeError("rec.batch: get_batch must return a tensor, a tuple/list of tensors or a dict of "
                    f"them, not {type(out).__name__}")


def describe_batch(out, device_name):
    """get_batch's result as (tensors, description): how to rebuild it and each tensor's dtype,
    shape and device (device_name(t.device))."""
    tensors, layout = batch_tensors(out)
    return tensors, {**layout, "tensors": [{"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                                           "device": device_name(t.device)} for t in tensors]}


def shapes_text(desc):
    return ", ".join(f"{d['dtype']} {tuple(d['shape'])}" for d in desc["tensors"])


def rebuild_batch(tensors, desc):
    kind = desc["kind"]
    if kind == "tensor":
        return tensors[0]
    if kind == "dict":
        return dict(zip(desc["keys"], tensors))
    return tuple(tensors) if kind == "tuple" else tensors


def decode_batch(rec, device=None, rank=0):
    """A recorded step's batch (ScriptReplay.step's dict) as get_batch returned it, on the
    recorded device (or `device`); of a data-parallel recording, rank `rank`'s (each tensor is
    stored as the ranks' stack)."""
    desc = json.loads(rec["extra"])["batch"]
    ranks = int(desc.get("ranks", 1))
    if not 0 <= rank < ranks:
        raise ValueError(f"the recording holds the batches of {ranks} rank(s), not of rank {rank}")
    raw, tensors, at = rec["batch"], [], 0
    for d in desc["tensors"]:
        t = torch.empty(d["shape"], dtype=getattr(torch, d["dtype"]))
        n = t.numel() * t.element_size()
        if n:
            mine = raw[at + rank * n:at + (rank + 1) * n]
            t.view(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(mine), dtype=torch.uint8))
        at += n * ranks
        tensors.append(t.to(device or d["device"]))
    return rebuild_batch(tensors, desc)
