"""Bytes: what tensors hold on a rank, what autograd saves for backward, what the CUDA allocator peaked at.

Every count here is of tensors, not of the process: buffers a library keeps aside (DDP's buckets, FSDP2's
all-gather buffers, the allocator's cache) appear only in :func:`peak_memory`, and only on a GPU.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable

import torch


def local_bytes(tensors) -> int:
    """Bytes of the tensors' elements on this rank: a ``DTensor`` counts its local shard only; ``None`` counts 0.

    This counts what each tensor shows (``nbytes``), not the storage behind it: FSDP2 pads every rank's shard
    of a parameter to the size of rank 0's, and a shard is a view without the padding, so a rank with a
    shorter shard is counted smaller than what it allocated (:func:`storage_bytes` counts that).
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


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's state tensors (Adam: ``exp_avg``, ``exp_avg_sq`` and a ``step`` per parameter)."""
    return local_bytes(v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))


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


class SavedTensorBytes:
    """A context in which every tensor autograd saves for backward is counted, once per storage.

    ``exclude``: tensors whose storage does not count (pass the parameters: a linear layer saves its
    weight, which is held anyway). Inside, ``torch.autograd.graph.saved_tensors_hooks`` sees each saved
    tensor; two tensors that share a storage (a view and its base, or one output saved by two operations,
    as a softmax's output is saved by the softmax and by the matrix product that reads it) count once, by
    the storage's size, which is what stays in memory.

    Attributes after the block: ``bytes`` (int), ``tensors`` (how many were saved), ``skipped_bytes``
    (bytes of saved tensors that share an excluded storage, counted once each).

        with SavedTensorBytes(exclude=model.parameters()) as saved:
            loss = model(x).sum()
        print(saved.bytes)
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._storages: dict[int, int] = {}
        self._skipped: dict[int, int] = {}
        self.tensors = 0

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self.tensors += 1
        where = self._skipped if storage.data_ptr() in self._excluded else self._storages
        where[storage.data_ptr()] = storage.nbytes()
        return tensor  # autograd keeps the tensor itself, as without the hook

    @property
    def bytes(self) -> int:
        return sum(self._storages.values())

    @property
    def skipped_bytes(self) -> int:
        return sum(self._skipped.values())

    def __enter__(self) -> SavedTensorBytes:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class SavedActivations(SavedTensorBytes):
    """Saved tensors less the model's weights, each counted by its local shard: what a layout's activations cost.

    The weights are read from ``model`` as each tensor is saved, so weights the model holds only for a while
    (FSDP2's gathered ones, freed after forward) are left out too; a ``DTensor`` counts its local tensor.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
        weights = {(p._local_tensor if isinstance(p, DTensor) else p).untyped_storage().data_ptr()
                   for p in self.model.parameters()}  # what the modules hold now: FSDP2's gathered weights too
        if local.untyped_storage().data_ptr() not in weights:
            super()._pack(local)
        return tensor


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class HeldSaved:
    """What autograd *holds* for backward over time, and its peak: each tensor saved inside the block counts
    from the forward that saved it until autograd lets it go (after its backward frees the graph).

    ``exclude``: tensors whose storage never counts (pass the parameters). ``label``: called at each save, it names
    what the tensor belongs to (a pipeline's (stage, micro-batch) being computed). Bytes count each storage once,
    by its whole size; autograd keeps an alias of each saved tensor (no copy), whose death a weak reference sees
    even where the tensor itself lives on (a pipeline stage's receive buffer).

    Attributes: ``bytes`` (held now), ``peak_bytes``, ``peak_labels`` (the most labels holding something at once).

        with HeldSaved(exclude=model.parameters(), label=lambda: current) as held:
            ...  # forwards and backwards, in any order
        print(held.peak_bytes, held.peak_labels)
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = (), label: Callable[[], object] = lambda: None):
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._label, self._lock = label, threading.Lock()  # a CUDA backward frees on autograd's own threads
        self._storages: dict[int, list[int]] = {}  # storage -> [aliases alive, bytes]
        self._labels: dict[object, int] = {}  # label -> aliases alive
        self.bytes = self.peak_bytes = self.peak_labels = 0

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in self._excluded:
            return tensor
        alias, label = tensor.detach(), self._label()
        with self._lock:
            held = self._storages.setdefault(storage.data_ptr(), [0, storage.nbytes()])
            self.bytes += held[1] if held[0] == 0 else 0
            held[0] += 1
            self._labels[label] = self._labels.get(label, 0) + 1
            self.peak_bytes, self.peak_labels = max(self.peak_bytes, self.bytes), max(self.peak_labels,
                                                                                      len(self._labels))
        weakref.finalize(alias, self._release, storage.data_ptr(), label)
        return alias

    def _release(self, pointer: int, label: object) -> None:
        with self._lock:
            held = self._storages[pointer]
            held[0] -= 1
            if held[0] == 0:
                self.bytes -= self._storages.pop(pointer)[1]
            self._labels[label] -= 1
            if self._labels[label] == 0:
                del self._labels[label]

    def __enter__(self) -> HeldSaved:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
