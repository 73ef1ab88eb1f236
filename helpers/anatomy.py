"""Measure the anatomy of one training step: what autograd saves, what a rank holds, what goes on the wire.

* :class:`SavedTensorBytes` counts the bytes of the tensors autograd keeps for backward (saved-tensor hooks);
* :func:`optimizer_bytes` adds up an optimizer's state tensors (with :func:`helpers.meters.local_bytes`);
* :class:`CollectiveLog` records every collective launched through PyTorch's dispatcher: kind, dtype, bytes;
* :func:`timeline` turns a ``torch.profiler`` run into rows of (name, thread, start, duration) to draw.

Measuring changes nothing about the step: hooks hand back the tensor they were given, the log calls the
collective it saw. The log does add a Python call per operation, so time a step without it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from helpers.meters import local_bytes


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


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's state tensors (Adam: ``exp_avg``, ``exp_avg_sq`` and a ``step`` per parameter)."""
    return local_bytes(v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))


_KINDS = (("allreduce", "all-reduce"), ("allgather", "all-gather"), ("reducescatter", "reduce-scatter"),
          ("reduce_scatter", "reduce-scatter"), ("broadcast", "broadcast"))


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective seen by :class:`CollectiveLog`: its kind (``"all-reduce"`` …), dtype and payload bytes."""

    kind: str
    dtype: str
    bytes: int


class CollectiveLog(TorchDispatchMode):
    """A context that records each all-reduce, all-gather, reduce-scatter and broadcast this process launches.

    Two ways in, so that none is missed: the ``c10d`` operators of PyTorch's dispatcher, which every
    collective goes through (DDP's bucket all-reduces, FSDP2's all-gathers and reduce-scatters), seen by
    this dispatch mode in the thread that entered it; and ``torch.distributed.all_reduce`` itself, replaced
    while the context is open, for all-reduces that a communication hook starts from a completion callback
    on another thread (PowerSGD does). A record's ``bytes`` is the payload on the full-size side: the
    tensors all-reduced or broadcast, the tensor an all-gather fills, the tensor a reduce-scatter splits.

    ``records`` is the list of :class:`Collective`; :meth:`counts` and :meth:`bytes` sum them by kind.
    """

    def __init__(self):
        super().__init__()
        self.records: list[Collective] = []
        self._lock = threading.Lock()
        self._inside = threading.local()  # set while our all_reduce wrapper runs: its c10d op is already logged

    def _record(self, kind: str, groups: list[list[torch.Tensor]]) -> None:
        payload = max(sum(t.nbytes for t in group) for group in groups)
        dtype = str(groups[0][0].dtype).removeprefix("torch.") if groups[0] else "?"
        with self._lock:
            self.records.append(Collective(kind, dtype, payload))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and not getattr(self._inside, "active", False):
            name = func.__name__.split(".")[0].replace("_base", "").replace("_into_tensor", "").strip("_")
            kind = next((k for key, k in _KINDS if name.startswith(key)), None)
            if kind is not None:
                self._record(kind, [[t for t in tree_leaves(a) if isinstance(t, torch.Tensor)] for a in args[:2]])
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        import torch.distributed as dist

        original = self._original = dist.all_reduce

        @functools.wraps(original)
        def all_reduce(tensor, *args, **kwargs):
            self._record("all-reduce", [[tensor]])
            self._inside.active = True
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self._inside.active = False

        dist.all_reduce = all_reduce
        return super().__enter__()

    def __exit__(self, *exc):
        import torch.distributed as dist

        dist.all_reduce = self._original
        return super().__exit__(*exc)

    def counts(self) -> dict[str, int]:
        """``{kind: how many}``, e.g. ``{"all-reduce": 3}``."""
        out: dict[str, int] = {}
        for r in self.records:
            out[r.kind] = out.get(r.kind, 0) + 1
        return out

    def bytes(self) -> dict[str, int]:
        """``{kind: payload bytes in all}``."""
        out: dict[str, int] = {}
        for r in self.records:
            out[r.kind] = out.get(r.kind, 0) + r.bytes
        return out


def timeline(prof, keep=lambda name: True) -> list[dict]:
    """The events of a finished ``torch.profiler.profile`` whose name ``keep`` accepts, as plain rows.

    Each row: ``{"name", "thread", "start_ms", "ms"}``, times in milliseconds from the first event kept;
    sorted by start. Rows are JSON-serialisable, so a rank can write them with its metrics.

    Only CPU-side events are kept: the timeline is the CPU's view. On a GPU an operation's row is the time
    the CPU spent issuing it; its kernel runs later, on the device's stream, and appears in no row.
    """
    events = [e for e in prof.events() if keep(e.name) and e.device_type == torch.autograd.DeviceType.CPU]
    if not events:
        return []
    t0 = min(e.time_range.start for e in events)
    rows = [{"name": e.name, "thread": e.thread, "start_ms": (e.time_range.start - t0) / 1000,
             "ms": (e.time_range.end - e.time_range.start) / 1000} for e in events]
    return sorted(rows, key=lambda r: r["start_ms"])
