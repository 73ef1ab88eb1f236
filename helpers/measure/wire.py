"""What a rank puts on the wire: the bytes it sends to other ranks and the messages gloo's algorithms use.

    with SentLog() as sent:
        out = attention(q, k, v)
        out.sum().backward()
    sent.bytes()     # {"all-to-all": 1572864}: bytes this rank sent to other ranks, by kind
    sent.calls()     # {"all-to-all": 5}
    sent.messages()  # {"all-to-all": 5}: on 2 ranks

One convention for every kind, whatever algorithm carries it: the bytes of the elements this rank sends to
*other* ranks. An all-gather sends its input to each of the N - 1 others; an all-to-all every split but its own;
a scatter's root every piece but its own (the others send nothing); a message (``send``) its tensor. (The
payload :class:`helpers.measure.comms.CollectiveLog` records is the size of the call's tensors instead: an
all-gather's includes this rank's own chunk.) Messages count what gloo's algorithms send on one machine, from
gloo's source: an all-gather is a ring of N - 1 steps; an all-to-all (``alltoallv``) sends to every peer, an
empty split too; a scatter's root sends N - 1 pieces; a ``send`` one.

:func:`ping_pong_alpha_beta` fits lesson 01's alpha-beta model between ranks 0 and 1.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.measure.comms import kind
from helpers.measure.timing import fit_alpha_beta


@dataclasses.dataclass(frozen=True)
class Sent:
    """One collective as it leaves this rank: its kind, the bytes sent to other ranks, the messages sent."""

    kind: str
    bytes: int
    messages: int


def _tensors(arg) -> list[torch.Tensor]:
    if isinstance(arg, torch.Tensor):
        return [arg]
    if isinstance(arg, (list, tuple)):
        return [t for a in arg for t in _tensors(a)]
    return []


def sent_by(op_kind: str, args, rank: int, world: int) -> Sent | None:
    """The :class:`Sent` of one ``c10d`` operator call with ``args`` on ``rank`` of ``world``; None for a receive."""
    if op_kind == "all-gather":  # (outputs, input, ...): this rank's input goes to every other rank
        return Sent(op_kind, (world - 1) * sum(t.nbytes for t in _tensors(args[1])), world - 1)
    if op_kind == "all-to-all":  # alltoall_base_(output, input, group, output_splits, input_splits, ...)
        source, splits = args[1], list(args[4]) if len(args) > 4 and args[4] else []
        row = source.nbytes // max(1, source.shape[0]) if source.dim() else source.nbytes
        own = splits[rank] * row if splits else source.nbytes // world
        return Sent(op_kind, source.nbytes - own, world - 1)
    if op_kind == "scatter":  # scatter_(outputs, inputs, group, root, ...): only the root sends
        root = args[3] if len(args) > 3 else 0
        if rank != root:
            return Sent(op_kind, 0, 0)
        pieces = _tensors(args[1])
        return Sent(op_kind, sum(t.nbytes for t in pieces) - pieces[rank].nbytes, world - 1)
    if op_kind == "send/recv":
        return None  # told apart by the operator's name in SentLog: a send sends its tensor, a receive nothing
    return Sent(op_kind, 0, 0)


class SentLog(TorchDispatchMode):
    """A context that records, for each collective this process launches on the default group and each message
    it sends, the bytes it sends to other ranks and the messages gloo sends (:func:`sent_by`). Sees what goes
    through PyTorch's dispatcher in this thread, autograd's backward on the CPU included. ``records`` is the
    list of :class:`Sent`; :meth:`bytes`, :meth:`calls` and :meth:`messages` sum them by kind."""

    def __init__(self):
        super().__init__()
        self.records: list[Sent] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            import torch.distributed as dist

            name = func.__name__.split(".")[0]
            found = kind(name)
            if found == "send/recv":
                if name.startswith("send"):
                    self.records.append(Sent(found, sum(t.nbytes for t in _tensors(args[0])), 1))
            elif found is not None:
                record = sent_by(found, args, dist.get_rank(), dist.get_world_size())
                if record is not None:
                    self.records.append(record)
        return func(*args, **(kwargs or {}))

    def _sum(self, field: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r.kind] = out.get(r.kind, 0) + getattr(r, field)
        return out

    def bytes(self) -> dict[str, int]:
        """``{kind: bytes this rank sent to other ranks}``."""
        return self._sum("bytes")

    def messages(self) -> dict[str, int]:
        """``{kind: messages this rank sent}``, as gloo's algorithms send them."""
        return self._sum("messages")

    def calls(self) -> dict[str, int]:
        """``{kind: how many calls}`` (a receive is no call of its own: its send is)."""
        out: dict[str, int] = {}
        for r in self.records:
            out[r.kind] = out.get(r.kind, 0) + 1
        return out


def ping_pong_alpha_beta(rank: int, sizes=tuple(2**p for p in range(8, 23, 2)), trips: int = 10):
    """Lesson 01's alpha-beta fit on the default group: ranks 0 and 1 send a message back and forth ``trips``
    times at each size (bytes, float32), and :func:`fit_alpha_beta` fits t = alpha + n beta to half of the
    fastest round trip of each size (other work on the machine only adds time); returns (alpha s, beta s/byte)
    on every rank (the others wait, then receive rank 0's fit). (0.0, 0.0) on one rank."""
    import torch.distributed as dist

    if dist.get_world_size() < 2:
        return 0.0, 0.0
    fit = torch.zeros(2, dtype=torch.float64)
    if rank < 2:
        sent, seconds = [], []
        for n in sizes:
            buffer = torch.zeros(n // 4)
            for _ in range(trips):
                start = time.perf_counter()
                for sender in (0, 1):
                    dist.send(buffer, 1 - rank) if rank == sender else dist.recv(buffer, 1 - rank)
                sent.append(n)
                seconds.append((time.perf_counter() - start) / 2)
        fit = torch.tensor(fit_alpha_beta(sent, seconds), dtype=torch.float64)
    dist.broadcast(fit, 0)
    return tuple(fit.tolist())
