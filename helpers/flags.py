"""Command-line flags with a domain: a bad value is a one-line error before any worker starts.

    parser.add_argument("--world-size", type=integer(low=2), default=3)
    parser.add_argument("--lr", type=number(above=0), default=0.1)
    parser.add_argument("--run-dir", type=folder, default="runs/x")
    add_device_flags(parser)                      # --backend, --device
    args = parser.parse_args()
    placement = check_placement(parser, args, args.world_size)
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from helpers.launch import BACKENDS, DEVICES, Placement, pick_backend, ranks_per_machine


def integer(low: int | None = None, high: int | None = None):
    """An argparse ``type``: an integer in ``[low, high]`` (either end may be open: ``None``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {_domain(low, high, '>=', '<=')}, got {value}")
        return value
    return parse


def number(low: float | None = None, high: float | None = None, *, above: float | None = None,
           below: float | None = None):
    """An argparse ``type``: a finite float with ``low <= x <= high`` and ``above < x < below`` (each optional)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad = (not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high)
               or (above is not None and value <= above) or (below is not None and value >= below))
        if bad:
            domain = " and ".join(d for d in (_domain(low, high, ">=", "<="), _domain(above, below, ">", "<")) if d)
            raise argparse.ArgumentTypeError(f"must be a finite number {domain}".rstrip() + f", got {text}")
        return value
    return parse


def folder(text: str) -> Path:
    """An argparse ``type``: a folder, created with its parents if missing; one that cannot be made is refused.

    argparse applies it to a string default too, so the default folder is created at parse time.
    """
    path = Path(text)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot create folder {text!r} ({e.strerror})") from None
    if not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {text!r} is not writable")
    return path


def _domain(low, high, ge: str, le: str) -> str:
    return " and ".join(f"{op} {v:g}" for op, v in ((ge, low), (le, high)) if v is not None)


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--backend`` (auto | gloo | nccl) and ``--device`` (auto | cpu | cuda), both defaulting to auto."""
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="auto: NCCL when every rank has its own GPU, else gloo")
    parser.add_argument("--device", default="auto", choices=DEVICES,
                        help="auto: the GPU(s) if present (shared by the ranks if fewer than ranks), else the CPU")


def check_placement(parser: argparse.ArgumentParser, args: argparse.Namespace, world_size: int,
                    share_gpus: bool = True) -> Placement:
    """:func:`pick_backend` for ``args.backend``/``args.device``; a refusal becomes ``parser.error`` (exit 2)."""
    try:
        return pick_backend(args.backend, ranks_per_machine(world_size), args.device, share_gpus)
    except ValueError as e:
        parser.error(str(e))
