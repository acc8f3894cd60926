"""rewind.record in a data-parallel script: torch.distributed with a world size N above 1 (a
torchrun of DDP, as nanoGPT's train.py runs on several GPUs). Every rank makes the recorder with
the same call; rank 0 writes the store. What differs between ranks reaches rank 0 each step
without holding up any rank's loop:

- each rank's batch: every tensor of get_batch's result is all-gathered into an (N, ...) stack
  through the default group (NCCL queues it in stream order: the host does not wait) and rank 0
  records the stack;
- each rank's generator states: pickled into a part of PART bytes (a header, the pickle, zeros),
  copied to the batch's device and all-gathered beside it; rank 0 hands the (N, PART) stack to
  the step writer, which reads it once the device is done (rewind._C's queue_step);
- rank 0's checkpoint decisions: the header of its part says whether a checkpoint falls LAG
  steps later; every rank reads that byte back LAG steps on (the copy long done), so all ranks
  take the checkpoint's generator states at the same step, with no host exchange.

The first step's batch descriptions are compared over gloo once (a host exchange): a batch of
another shape on any rank then, or on a rank's later step, is refused in one line (the stacks
need one shape). Model and optimizer state are rank 0's (DDP keeps them equal on every rank).
The loss, gradient norm and monitors a step records are rank 0's: its own micro-batches' loss,
as the script's `loss` on rank 0 is. A replay runs under torchrun with the same N: each rank
restores the checkpoint and its own generators, takes its own slice of each recorded batch,
rank 0 reports the steps and the ranks stop together (rank 0's decision, broadcast)."""
import collections
import struct

import torch

PART = 32 << 10  # bytes of one rank's generator states a step (a header, the pickle, zeros)
LAG = 4          # steps between rank 0's checkpoint decision and the checkpoint
_MAGIC = b"RWRK"
_HEADER = struct.Struct("<4sIIB3x")  # magic, part size, pickle size, checkpoint LAG steps on


_made = None  # (the default process group, its Ranks): a served script's runs share one


def world():
    """A Ranks for this process when it runs data-parallel, else None."""
    global _made
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    group = dist.group.WORLD
    if _made is None or _made[0] is not group:
        _made = (group, Ranks(dist))
    _made[1].decisions.clear()
    return _made[1]


class Ranks:
    def __init__(self, dist):
        self.dist = dist
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        # The host's exchanges run on gloo whatever the default backend is (NCCL takes device tensors).
        self.gloo_default = dist.get_backend() == "gloo"
        self.host = None if self.gloo_default else dist.new_group(backend="gloo")
        self.decisions = collections.deque()  # (step, header copy on the host, its copy's event)

    def root(self):
        return self.rank == 0

    def flag(self, value):
        """Rank 0's `value` (an int), on every rank (a host exchange)."""
        t = torch.tensor([int(value)], dtype=torch.int64)
        self.dist.broadcast(t, 0, group=self.host)
        return int(t.item())

    def all_objects(self, obj):
        """[obj of rank 0, obj of rank 1, ...] on every rank (pickled, over gloo: a host exchange)."""
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.host)
        return out

    def _group(self, t):
        """The group that gathers `t` (None: the default), and `t` as that group takes it."""
        if not t.is_cuda and not self.gloo_default:
            return self.host, t  # a CPU tensor in an NCCL job: gloo's
        if t.is_cuda and self.gloo_default:
            return None, t.cpu()  # gloo gathers host tensors
        return None, t

    def stack(self, tensors):
        """Each tensor all-gathered over the ranks as one (N, *shape) tensor (every rank gets
        them; rank 0 records them). The ranks' shapes must agree (rec.batch compares them)."""
        out = []
        for t in tensors:
            group, t = self._group(t.detach().contiguous())
            parts = [torch.empty_like(t) for _ in range(self.size)]
            self.dist.all_gather(parts, t, group=group)
            out.append(torch.stack(parts))
        return out

    def states(self, blob, device, checkpoint_later=False):
        """Every rank's `blob` (its generator states, _rng_state()) as an (N, PART) uint8 stack on
        `device` (queued, as stack()), rank 0's part saying whether a checkpoint is due LAG steps
        on (keep_decision)."""
        if len(blob) > PART - _HEADER.size:
            raise ValueError(f"rank {self.rank}'s generator states take {len(blob)} bytes; a data-parallel "
                             f"recording keeps {PART - _HEADER.size} a rank")
        host = torch.zeros(PART, dtype=torch.uint8, pin_memory=device.type == "cuda")
        head = _HEADER.pack(_MAGIC, PART, len(blob), 1 if checkpoint_later else 0)
        host[:_HEADER.size + len(blob)] = torch.frombuffer(bytearray(head + blob), dtype=torch.uint8)
        return self.stack([host.to(device, non_blocking=True)])[0]

    def keep_decision(self, stack, step):
        """Copies the header of rank 0's part of a states() stack back to the host, for
        decision(step)."""
        head = stack[0, :_HEADER.size]
        if stack.is_cuda:
            back = torch.empty(_HEADER.size, dtype=torch.uint8, pin_memory=True)
            back.copy_(head, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            back, done = head.clone(), None
        self.decisions.append((step, back, done))

    def decision(self, step):
        """Whether rank 0 took a checkpoint at `step` (its part's header LAG steps before), on
        every rank; False where no step that long before was gathered."""
        while self.decisions and self.decisions[0][0] < step:
            self.decisions.popleft()
        if not self.decisions or self.decisions[0][0] != step:
            return False
        _, back, done = self.decisions.popleft()
        if done is not None:
            done.synchronize()  # copied LAG steps ago: done long before
        return bool(_HEADER.unpack(back.numpy().tobytes())[3])


def own_state(blob, rank):
    """Rank `rank`'s generator states of a recorded blob: a data-parallel recording keeps every
    rank's part (Ranks.states); a one-process one is the blob itself."""
    blob = bytes(blob)
    if blob[:4] != _MAGIC:
        return blob
    part = _HEADER.unpack(blob[:_HEADER.size])[1]
    if part <= 0 or len(blob) % part or rank >= len(blob) // part:
        raise ValueError(f"the recording has the generator states of {len(blob) // max(part, 1)} ranks, "
                         f"not of rank {rank}")
    mine = blob[rank * part:(rank + 1) * part]
    magic, _, size, _ = _HEADER.unpack(mine[:_HEADER.size])
    if magic != _MAGIC:
        raise ValueError(f"rank {rank}'s generator states are damaged in the recording")
    return mine[_HEADER.size:_HEADER.size + size]
