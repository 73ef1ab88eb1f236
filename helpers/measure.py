"""Measuring beside the idea: when a module computes, and what its process spends doing it.

    timeline = Timeline()
    out = timeline.run(k, net, x)        # net(x); notes micro-batch k's forward now, its backward later
    timeline.take()                      # [(k, "forward" | "backward", start, end), ...] in wall-clock seconds
    process_usage()                      # {"cpu_seconds": ..., "page_faults": ... or None}

Page faults and glibc's malloc arenas exist only on Linux with glibc. Where they do not, the functions
here print one line that says what is skipped and why, and return None or do nothing, instead of failing.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import torch

_SAID = set()  # what this process has already said it skips: one line each


def linux_glibc(what: str) -> bool:
    """True on Linux with glibc; elsewhere print once "``what``: skipped, ..." and return False."""
    libc = platform.libc_ver()[0]
    if sys.platform.startswith("linux") and libc == "glibc":
        return True
    if what not in _SAID:
        _SAID.add(what)
        print(f"{what}: skipped, it needs Linux with glibc (this is {sys.platform}, C library "
              f"{libc or 'unknown'})", flush=True)
    return False


def page_faults() -> int | None:
    """Minor page faults of this process so far (Linux with glibc), else None after one printed line."""
    if not linux_glibc("page faults"):
        return None
    import resource  # not on Windows

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def process_usage() -> dict:
    """This process's CPU seconds (all its threads) and page faults so far: ``{"cpu_seconds", "page_faults"}``."""
    return {"cpu_seconds": time.process_time(), "page_faults": page_faults()}


def usage_since(before: dict) -> tuple[dict, dict]:
    """``(what this process spent since before, now)``, both shaped as :func:`process_usage`; None stays None."""
    now = process_usage()
    spent = {key: None if now[key] is None or before[key] is None else now[key] - before[key] for key in now}
    return spent, now


def set_malloc_arenas(arenas: int) -> None:
    """Make processes started from here use at most ``arenas`` glibc malloc arenas (0: glibc's default).

    Sets ``MALLOC_ARENA_MAX``, which each new process's C library reads as it starts; on a system
    without glibc it prints one line and does nothing.
    """
    if arenas and linux_glibc(f"MALLOC_ARENA_MAX={arenas}"):
        os.environ["MALLOC_ARENA_MAX"] = str(arenas)


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

