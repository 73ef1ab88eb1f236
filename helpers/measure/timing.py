"""Time: clocks that wait for the GPU, seconds per phase, and two timelines of a step.

Two timelines, because they answer different questions:

* :class:`Timeline` stamps an ``nn.Sequential``'s forward and backward of each micro-batch with wall-clock
  time (``time.time()``), which every process on a machine shares: lesson 05 draws the stages of a pipeline,
  each in its own process, on one time axis.
* :func:`profiler_rows` reads a ``torch.profiler`` run of one process: every operation, on its thread, which
  shows what ran beside what inside a process (lesson 12: backward and the all-reduces). The profiler's clock
  is its own, so rows from different processes are not on one axis.

:func:`message_seconds` times one message between two ranks, and :func:`fit_alpha_beta` fits lesson 01's
model of a message, t = alpha + n beta, to such times.
"""

from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def clock(device: torch.device) -> float:
    """``time.perf_counter()`` once the GPU's queued work (if ``device`` is one) is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def wall_clock(device: torch.device) -> float:
    """``time.time()``, which every process of a machine shares, once the GPU's queued work (if any) is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.time()


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


class ActionLog:
    """When each action of a ``torch.distributed.pipelining`` schedule ran on this rank, in wall-clock seconds.

        log = ActionLog(stages)      # the PipelineStage objects this rank holds
        schedule.step(...)           # runs as before; each compute action is noted
        log.take()                   # [(stage, action, micro-batch, start, end), ...], action "F" "B" "I" "W"
                                     #  or "wait" (for a send or receive of activations or gradients)

    F is a forward, B a full backward, I the backward to the input only, W the weight gradients it left for
    later (the zero-bubble schedules). The stage's methods are wrapped on this instance, nothing else changes;
    ``time.time()`` is shared by every process of a machine, so the ranks' rows lie on one axis; on a GPU each
    action is timed from and to a ``torch.cuda.synchronize`` (its kernels, not their launch). ``current`` is the
    (stage, micro-batch) of the last action started. "wait" rows
    (stage -1, micro-batch -1) time the schedule's waits for its sends and receives, where its module exposes them
    (a private function of torch's; without it those waits stay in the idle time).
    """

    def __init__(self, stages):
        self.rows, self.current = [], None
        for stage in stages:
            self._wrap(stage)
        import torch.distributed.pipelining.schedules as schedules

        wait = getattr(schedules, "_wait_batch_p2p", None)  # private: absent, the waits stay unlabelled idle time
        if wait is not None and not hasattr(wait, "logs"):
            wait = schedules._wait_batch_p2p = _timed_wait(wait)
        if wait is not None:
            wait.logs[:] = [self]  # the newest log of this process takes the waits

    def _timed(self, device, stage, action, k, fn, *args, **kwargs):
        self.current, start = (stage, k), wall_clock(device)
        out = fn(*args, **kwargs)
        self.rows.append((stage, action, k, start, wall_clock(device)))
        return out

    def _wrap(self, stage):
        i, d = stage.stage_index, torch.device(stage.device)
        forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk
        stage.forward_one_chunk = lambda k, *a, **kw: self._timed(d, i, "F", k, forward, k, *a, **kw)
        stage.backward_one_chunk = lambda k, *a, full_backward=True, **kw: self._timed(
            d, i, "B" if full_backward else "I", k, backward, k, *a, full_backward=full_backward, **kw)
        stage.backward_weight_one_chunk = lambda k, *a, **kw: self._timed(d, i, "W", k, weight, k, *a, **kw)

    def take(self) -> list[tuple[int, str, int, float, float]]:
        """The rows since the last call, in the order they ended; starts a new list."""
        rows, self.rows = self.rows, []
        return rows


def message_seconds(tensor: torch.Tensor, rank: int, peer: int, trips: int = 20) -> float:
    """The time one message of ``tensor`` takes between this rank and ``peer`` (both call it): half the median
    round trip of ``trips`` send/recv pairs on the default process group. Rank ``min(rank, peer)`` sends first.
    A CUDA tensor's trip is timed to its arrival on the GPU (:func:`clock` synchronises)."""
    import torch.distributed as dist

    seconds = []
    for _ in range(trips):
        start = clock(tensor.device)
        for sender in sorted((rank, peer)):
            dist.send(tensor, peer) if rank == sender else dist.recv(tensor, peer)
        seconds.append((clock(tensor.device) - start) / 2)
    return sorted(seconds)[len(seconds) // 2]


def fit_alpha_beta(sizes, seconds) -> tuple[float, float]:
    """alpha (seconds per message) and beta (seconds per byte) of t = alpha + n beta, fitted to the fastest
    time of each message size n so that each size weighs the same (least squares of the relative errors).

    ``sizes`` and ``seconds`` are numbers in matching order (lists, arrays or tensors); a size may come several
    times (one time per trip), and only its fastest time counts: other work on a machine only ever adds time.
    Minimising sum(((alpha + n beta - t) / t)^2) is ordinary least squares after dividing each row by its t;
    plain least squares of t would let the largest messages (the largest errors in seconds) decide alpha.
    """
    n_all, t_all = (torch.as_tensor(x, dtype=torch.float64).flatten().tolist() for x in (sizes, seconds))
    if len(n_all) != len(t_all):
        raise ValueError(f"{len(n_all)} sizes but {len(t_all)} times")
    fastest = {}
    for n, t in zip(n_all, t_all, strict=True):
        if not t > 0:
            raise ValueError(f"a message of {n:g} bytes took {t} s: times must be positive")
        fastest[n] = min(t, fastest.get(n, float("inf")))
    if len(fastest) < 2:
        raise ValueError(f"fitting alpha and beta needs at least two message sizes, got {sorted(fastest)}")
    n, t = (torch.tensor(list(x), dtype=torch.float64) for x in (fastest.keys(), fastest.values()))
    scale = n.abs().max()  # n / scale keeps both columns near 1 / t: a well-conditioned problem
    rows = torch.stack([torch.ones_like(n), n / scale], dim=1) / t[:, None]
    alpha, beta = torch.linalg.lstsq(rows, torch.ones_like(t)[:, None]).solution.flatten().tolist()
    return alpha, beta / scale.item()


class OpCount(TorchDispatchMode):
    """A context that counts the operations PyTorch dispatches in it (``count``): each ATen operation a step
    runs, forward, backward and optimizer, every one of which pays PyTorch's fixed cost of an operation,
    however few elements it touches. An operation on a ``DTensor`` counts once, and so does each operation it
    runs on its local shard.

        with OpCount() as ops:
            loss = model(x).sum()
        print(ops.count)
    """

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        self.count += 1
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor runs it, and its local operations come back here
        return func(*args, **(kwargs or {}))


def _timed_wait(wait):
    """``wait`` (the schedules' wait for their sends and receives), noting each wait in the current ActionLog."""
    def timed(work, *args, **kwargs):
        start = time.time()
        out = wait(work, *args, **kwargs)
        for log in timed.logs:
            log.rows.append((-1, "wait", -1, start, time.time()))
        return out

    timed.logs = []
    return timed
