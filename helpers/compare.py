"""Compare weights across ranks, runs and processes: the lessons' proofs end in these two calls."""

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
