"""Measuring beside a training step: clocks that wait for the GPU, phase laps, bytes held, collectives counted.

Lessons 07 and 09 time and count their steps with these, so that their scripts keep the step itself in view.
"""

import time

import torch


def clock(device: torch.device) -> float:
    """``time.perf_counter()`` once the GPU's queued work (if ``device`` is one) is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Laps:
    """Seconds spent in named phases, summed over repeats: ``start()``, then ``lap(name)`` after each phase.

    ``means(n)`` returns ``{name: seconds per repeat}`` over ``n`` repeats.
    """

    def __init__(self, device: torch.device):
        self.device, self.totals, self.last = device, {}, None

    def start(self) -> None:
        self.last = clock(self.device)

    def lap(self, name: str) -> None:
        now = clock(self.device)
        self.totals[name] = self.totals.get(name, 0.0) + now - self.last
        self.last = now

    def means(self, n: int) -> dict[str, float]:
        return {name: total / n for name, total in self.totals.items()}


def local_bytes(tensors) -> int:
    """Bytes of the tensors' elements on this rank: a ``DTensor`` counts its local shard only; ``None`` counts 0.

    This counts what each tensor shows (``nbytes``), not the storage behind it: FSDP2 pads every rank's shard
    of a parameter to the size of rank 0's, and a shard is a view without the padding, so a rank with a
    shorter shard is counted smaller than what it allocated (:func:`storage_bytes` counts that). Nor is it
    the allocator's memory: buffers a library keeps aside (DDP's buckets, FSDP2's all-gather buffers, the
    allocator's cache) do not appear in it.
    """
    from torch.distributed.tensor import DTensor

    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors if t is not None)


def storage_bytes(tensors) -> int:
    """Bytes of the storages behind the tensors on this rank, each storage once: what was allocated for them.

    A ``DTensor`` counts its local shard's storage (padding included); views of one storage count it once;
    ``None`` counts 0.
    """
    from torch.distributed.tensor import DTensor

    storages = {}
    for t in tensors:
        if t is not None:
            storage = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def peak_memory(device: torch.device) -> int | None:
    """The most bytes the CUDA allocator held on ``device`` since the last reset; ``None`` off the GPU.

    On the CPU PyTorch keeps no such counter (the process's resident size mixes in the interpreter, the
    libraries and freed memory the C allocator keeps), so nothing is reported there.
    """
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for :func:`peak_memory` (a no-op off the GPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def plain_name(op) -> str:
    """A collective's plain name (all-gather, reduce-scatter, all-reduce, broadcast) from its op's name."""
    text = str(op).replace("_", "")
    return next((name for key, name in (("allgather", "all-gather"), ("reducescatter", "reduce-scatter"),
                                         ("allreduce", "all-reduce"), ("broadcast", "broadcast")) if key in text),
                str(op))


def collective_counts(comm) -> dict[str, int]:
    """``{plain name: count}`` of the collectives a ``CommDebugMode`` saw while it was active."""
    counts = {}
    for op, k in comm.get_comm_counts().items():
        counts[plain_name(op)] = counts.get(plain_name(op), 0) + k
    return counts
