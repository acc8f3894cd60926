"""rewind doctor's side in the script: when `rewind doctor --cmd "python3 train.py ..."` starts
it with REWIND_DOCTOR set, rewind.record records nothing; instead it hashes the bits of every
tensor the loop's first steps compute (each aten op's outputs through a TorchDispatchMode, so
the backward's and the optimizer's ops too), with the module whose forward ran it, and writes
them to a file. `rewind doctor` runs the script twice and names the first op whose bits differ."""
import hashlib
import json
import struct

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _C
from torch.utils._pytree import tree_flatten


def _words(t):
    """A tensor's bytes in C order as a flat uint8 tensor on its device, zero-padded to whole
    32-bit words (what the digest's word sums read)."""
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = -b.numel() % 4
    return torch.cat([b, b.new_zeros(pad)]) if pad else b


def tensor_hash(t):
    """16 hex digits of a hash of a tensor's bits (its dtype and shape, then its bytes in C order)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


class _HashOps(TorchDispatchMode):
    """Hashes every tensor an aten op returns, in the order the ops run."""

    def __init__(self, doctor):
        super().__init__()
        self.doctor = doctor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func)
        # Uninitialized memory (empty*) and the profiler's handles (record_function, as
        # optimizer.step opens one) are no results: their bits mean nothing.
        if "empty" in func.__name__ or name.startswith("profiler."):
            return out
        # A view (select, slice, transpose: an output aliasing an input, not written) holds no
        # result of its own: its bits are its base's, hashed where an op wrote them, and a view
        # of a buffer a kernel fills later (autocast's attention backward) reads memory not yet
        # written. An in-place op's output aliases its input too, but it wrote it: hashed.
        views = [r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns]
        outs = out if isinstance(out, (tuple, list)) and len(views) > 1 else (out,)
        for i, o in enumerate(outs):
            if i < len(views) and views[i]:
                continue
            for t in tree_flatten(o)[0]:
                if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
                    self.doctor.op(name, t)
        return out


class Doctor:
    """Hashes the first `steps` steps of the loop: the parameters before them, each step's batch,
    every op's outputs, the loss and the parameters after each step."""

    def __init__(self, spec, model, optimizer):
        self.steps = int(spec["steps"])
        self.model = model
        self._report = open(spec["report"], "w", buffering=1 << 16)
        self._modules = []     # names of the modules whose forward is running, innermost last
        self._in_optimizer = False
        self._index = 0        # ops hashed in this step
        self._step = 0
        self._mode = _HashOps(self)
        # The step's op lines wait for their hashes: each op's output gets a digest word sum
        # (rewind's "d2" terms) queued on its device into sums[device][i], and the lines are
        # written at the step's end from one copy of the sums, so hashing never waits for the
        # GPU nor copies an activation to the host (a host copy and hash of every op's output
        # did not finish two gpt2-small steps twice in minutes).
        self._pending = []  # (line, device, index, words)
        self._sums = {}     # device -> [int64 tensor of sums, entries used]
        types = {}
        for name, m in model.named_modules():
            types[name or "(model)"] = type(m).__name__
            m.register_forward_pre_hook(self._enter_module(name or "(model)"))
            m.register_forward_hook(self._leave_module)
        step = optimizer.step

        def optimizer_step(*args, **kwargs):  # its ops are named as the optimizer's
            self._in_optimizer = True
            try:
                return step(*args, **kwargs)
            finally:
                self._in_optimizer = False
        optimizer.step = optimizer_step
        self._write({"start": 0, "steps": self.steps, "torch": torch.__version__,
                     "deterministic": torch.are_deterministic_algorithms_enabled(), "modules": types})
        self._write({"step": -1, "what": "parameters", "name": "the parameters before the first step",
                     "hash": self._parameters_hash()})

    def _enter_module(self, name):
        def hook(module, inputs):
            self._modules.append(name)
        return hook

    def _leave_module(self, module, inputs, output):
        if self._modules:
            self._modules.pop()

    def _parameters_hash(self):
        names = ",".join(name for name, _ in self.model.named_parameters())
        digest = _C.param_digest_queued([p for _, p in self.model.named_parameters()])()
        return hashlib.blake2b((names + digest).encode(), digest_size=8).hexdigest()

    def _queue_hash(self, line, t):
        b = _words(t)
        entry = self._sums.get(b.device)
        if entry is None or entry[1] == entry[0].numel():
            grown = torch.zeros(max(1024, 2 * entry[0].numel()) if entry else 1024, dtype=torch.int64, device=b.device)
            if entry:
                grown[:entry[1]].copy_(entry[0][:entry[1]])
            entry = self._sums[b.device] = [grown, entry[1] if entry else 0]
        if b.numel():
            _C.add_word_sums([b], entry[0], entry[1])
        self._pending.append((line, b.device, entry[1], b.numel() // 4))
        entry[1] += 1

    def _write_pending(self):
        host = {d: e[0][:e[1]].cpu().tolist() for d, e in self._sums.items()}
        for line, device, i, words in self._pending:
            line["hash"] = "%x.%016x" % (words, host[device][i] & 0xFFFFFFFFFFFFFFFF)
            self._write(line)
        self._pending, self._sums = [], {}

    def _write(self, obj):
        self._report.write(json.dumps(obj) + "\n")

    def op(self, name, t):
        if self._in_optimizer:
            phase = "optimizer"
        elif self._modules:
            phase = "forward"
        else:  # autograd runs the backward with grad mode off, as no_grad code (clipping) runs
            phase = "forward" if torch.is_grad_enabled() else "backward"
        self._queue_hash({"step": self._step, "i": self._index, "what": "op", "name": name, "phase": phase,
                          "module": self._modules[-1] if self._modules else "", "shape": list(t.shape),
                          "dtype": str(t.dtype).replace("torch.", "")}, t)
        self._index += 1

    def begin_step(self, step, batch):
        """After get_batch: hashes the batch, then every op until end_step."""
        self._step, self._index = step, 0
        tensors = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor)]
        h = hashlib.blake2b(digest_size=8)
        for t in tensors:
            h.update(tensor_hash(t).encode())
        self._write({"step": step, "what": "batch", "name": "the batch get_batch returned", "hash": h.hexdigest()})
        self._mode.__enter__()

    def end_step(self, step, loss):
        """At rec.step: the loss's bits and the parameters. True after the last step (the
        recorder then ends the script's window: the report is complete)."""
        self._mode.__exit__(None, None, None)
        self._write_pending()
        self._write({"step": step, "what": "loss", "name": "the loss",
                     "hash": struct.pack("<f", loss).hex()})
        self._write({"step": step, "what": "parameters", "name": "the parameters after the step",
                     "hash": self._parameters_hash()})
        if step + 1 >= self.steps:
            self._write({"done": step})
            self._report.close()
            return True
        return False
