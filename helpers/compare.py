"""Compare weights across ranks, runs and processes: the lessons' proofs end in these calls, and start with
:func:`exact_math` where they run on a GPU."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def flat(tensors: nn.Module | Iterable[torch.Tensor]) -> torch.Tensor:
    """A module's parameters (in ``parameters()`` order), or any tensors, as one flat float64 CPU vector."""
    if isinstance(tensors, nn.Module):
        tensors = tensors.parameters()
    parts = [t.detach().to("cpu", torch.float64).flatten() for t in tensors]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def max_diff(a, b) -> float:
    """Largest absolute elementwise difference between two modules or tensor lists (flattened alike).

    Raises ValueError when they hold different numbers of values.
    """
    a, b = flat(a), flat(b)
    if a.shape != b.shape:
        raise ValueError(f"cannot compare {a.numel()} values with {b.numel()}")
    return (a - b).abs().max().item() if a.numel() else 0.0


def exact_math(device) -> None:
    """The course's rule for an equality proof on CUDA: plain float32 (no TF32 in matrix products or
    convolutions) and deterministic cuDNN kernels, so two runs that do the same work give the same numbers.

    A proof calls it in every process it compares, before its first computation. A CPU needs none of it, and
    it changes nothing there.
    """
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
