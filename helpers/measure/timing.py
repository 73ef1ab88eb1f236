"""Time: clocks that wait for the GPU, seconds per phase, and two timelines of a step.

Two timelines, because they answer different questions:

* :class:`Timeline` stamps an ``nn.Sequential``'s forward and backward of each micro-batch with wall-clock
  time (``time.time()``), which every process on a machine shares: lesson 05 draws the stages of a pipeline,
  each in its own process, on one time axis.
* :func:`profiler_rows` reads a ``torch.profiler`` run of one process: every operation, on its thread, which
  shows what ran beside what inside a process (lesson 10: backward and the all-reduces). The profiler's clock
  is its own, so rows from different processes are not on one axis.
"""

from __future__ import annotations

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


class _Stamp(torch.autograd.Function):
    """The identity; its backward calls ``note()`` when the gradient arrives."""

    @staticmethod
    def forward(ctx, x, note):
        ctx.note = note
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.note()
        return grad, None


class Timeline:
    """When an ``nn.Sequential`` ran each micro-batch forward and backward, in wall-clock seconds.

        timeline = Timeline()
        out = timeline.run(k, net, x)   # net(x); notes micro-batch k's forward now, its backward later
        timeline.take()                 # [(k, "forward" | "backward", start, end), ...]

    ``run(k, net, x)`` returns ``net(x)`` and notes ``(k, "forward", start, end)``; once autograd has
    run the backward of that output down to the input, it notes ``(k, "backward", start, end)``: from
    the moment the gradient reached the output to the moment the node nearest the input has run. On a
    GPU both ends wait for the device (``torch.cuda.synchronize``): an end is when the kernels are done,
    not when the CPU has queued them.
    """

    def __init__(self):
        self.trace, self._grad_arrived = [], {}

    def run(self, k, net: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        start = time.time()
        h = net[0](x)
        device = h.device
        (x if x.requires_grad else h).grad_fn.register_hook(lambda *_: self._backward_done(k, device))
        out = _Stamp.apply(net[1:](h), lambda: self._grad_arrived.setdefault(k, time.time()))
        if out.is_cuda:
            torch.cuda.synchronize(out.device)  # the forward ends when the GPU is done, not when it is queued
        self.trace.append((k, "forward", start, time.time()))
        return out

    def _backward_done(self, k, device):
        if device.type == "cuda":  # the hook runs when the last kernel is queued: wait until it has run
            torch.cuda.synchronize(device)
        self.trace.append((k, "backward", self._grad_arrived.pop(k), time.time()))

    def take(self) -> list[tuple[int, str, float, float]]:
        """The notes since the last call: ``[(micro-batch, phase, start, end), ...]``; starts a new list."""
        trace, self.trace = self.trace, []
        return trace


def profiler_rows(prof, keep=lambda name: True, kernels: bool = False) -> list[dict]:
    """The events of a finished ``torch.profiler.profile`` whose name ``keep`` accepts, as plain rows.

    Each row: ``{"name", "thread", "start_ms", "ms", "device"}``, times in milliseconds from the first row,
    ``device`` ``"cpu"`` or ``"cuda"``; sorted by start. Rows are JSON-serialisable, so a rank can write them
    with its metrics.

    A CPU row is the CPU's view: on a GPU an operation's CPU row is the time spent issuing it; its kernel runs
    later, on the device. With ``kernels=True`` (and ``ProfilerActivity.CUDA`` in the profile) the device's
    own work comes too, whatever its name: kernels and copies (``"Memcpy DtoH ..."``), ``thread`` being the
    stream. The device-side copy of a CPU label (a ``record_function`` name, a collective's name: the profiler
    lists it once on each side) is left out either way.
    """
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    events = prof.events()
    chosen = [(e, "cpu") for e in events if e.device_type == cpu and keep(e.name)]
    if kernels:
        labels = {e.name for e in events if e.device_type == cpu}
        chosen += [(e, "cuda") for e in events if e.device_type == cuda and e.name not in labels]
    if not chosen:
        return []
    t0 = min(e.time_range.start for e, _ in chosen)
    rows = [{"name": e.name, "thread": e.thread, "start_ms": (e.time_range.start - t0) / 1000,
             "ms": (e.time_range.end - e.time_range.start) / 1000, "device": device} for e, device in chosen]
    return sorted(rows, key=lambda r: r["start_ms"])
