"""Collectives: what a process launches, by kind, dtype and payload bytes, and their plain names.

    with CollectiveLog() as log:
        loss.backward(); optimizer.step()
    log.counts()   # {"all-reduce": 2}
    log.bytes()    # {"all-reduce": 3261440}

The log sees every collective that goes through PyTorch's dispatcher: the ``c10d`` operators behind
``torch.distributed``'s calls (DDP's bucket all-reduces, FSDP2's all-gathers and reduce-scatters, ZeRO's
broadcasts) and the functional collectives (``_c10d_functional``) that DTensor's redistributions issue
(tensor parallelism). It adds a Python call per operation, so time a step without it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# an operator's name, underscores removed, contains one of these: c10d's allreduce_, _allgather_base_,
# _reduce_scatter_base_, broadcast_, alltoall_base_, scatter_, send, recv_; the functional all_reduce,
# all_gather_into_tensor, ... (first match wins: "reducescatter" before "scatter")
KINDS = (("allreduce", "all-reduce"), ("allgather", "all-gather"), ("reducescatter", "reduce-scatter"),
         ("broadcast", "broadcast"), ("alltoall", "all-to-all"), ("scatter", "scatter"), ("send", "send/recv"),
         ("recv", "send/recv"))
NAMESPACES = ("c10d", "_c10d_functional")


def kind(op) -> str | None:
    """The plain name of a collective operator (``"all-reduce"``, ``"all-gather"``, ``"reduce-scatter"``,
    ``"broadcast"``, ``"all-to-all"``, ``"scatter"``; ``"send/recv"`` for a message either way), from the operator
    or its name; ``None`` for anything else."""
    text = str(op).replace("_", "")
    return next((name for key, name in KINDS if key in text), None)


def plain_name(op) -> str:
    """:func:`kind`, or the operator's own name where it is none of those (for printing counts by name)."""
    return kind(op) or str(op)


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective seen by :class:`CollectiveLog`: its kind (``"all-reduce"`` …), dtype and payload bytes."""

    kind: str
    dtype: str
    bytes: int


class CollectiveLog(TorchDispatchMode):
    """A context that records each all-reduce, all-gather, reduce-scatter, broadcast, all-to-all and scatter
    this process launches, and each message it sends or receives (``"send/recv"``, as a pipeline's stages do).

    Two ways in, so that none is missed: the operators of PyTorch's dispatcher (``c10d`` and
    ``_c10d_functional``), which every collective goes through, seen by this dispatch mode in the thread that
    entered it (a ``DTensor`` operation is let through to DTensor, whose own collectives the mode then sees);
    and ``torch.distributed.all_reduce`` itself, replaced while the context is open, for all-reduces that a
    communication hook starts from a completion callback on another thread (PowerSGD does). A record's
    ``bytes`` is the payload on the full-size side: the tensors all-reduced or broadcast, the tensor an
    all-gather fills, the tensor a reduce-scatter splits, the tensors a scatter's root
    hands out, the tensor a message carries.

    ``records`` is the list of :class:`Collective`; :meth:`counts` and :meth:`bytes` sum them by kind.
    """

    def __init__(self):
        super().__init__()
        self.records: list[Collective] = []
        self._lock = threading.Lock()
        self._inside = threading.local()  # set while our all_reduce wrapper runs: its c10d op is already logged

    def _record(self, kind_: str, groups: list[list[torch.Tensor]], times: int = 1) -> None:
        payload = times * max(sum(t.nbytes for t in group) for group in groups)
        dtype = str(groups[0][0].dtype).removeprefix("torch.") if groups[0] else "?"
        with self._lock:
            self.records.append(Collective(kind_, dtype, payload))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor runs the operation, and the mode sees the collectives it issues
        if func.namespace in NAMESPACES and not getattr(self._inside, "active", False):
            name = kind(func.__name__.split(".")[0])
            if name is not None:
                groups = [[t for t in tree_leaves(a) if isinstance(t, torch.Tensor)] for a in args[:2]]
                # the functional all-gather's arguments are its input and the group's size: it fills size x input
                times = args[1] if func.namespace == "_c10d_functional" and name == "all-gather" else 1
                self._record(name, groups, times)
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
