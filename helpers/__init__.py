"""Plumbing shared by the lessons of *Distributed PyTorch, hands-on*.

Modules: ``launch`` (start workers, run scripts), ``warm`` (scripts forked from a process that imported
torch once), ``startup`` (what each way of starting a run costs: ``python -m helpers.startup``),
``rpc`` (RRef method calls), ``metrics`` (per-rank JSON lines), ``plots`` (the course's figures),
``data`` (MNIST, online or the shipped subset), ``flags`` (argparse types with domains),
``checkpoint`` (atomic saves), ``compare`` (differences between tensors), ``system`` (what differs
between Linux, macOS and Windows), ``processes`` (launchers started together, output prefixed),
``measure`` (time, memory, collectives and what a process spends: one module each), ``build`` (what
``make course`` runs). Importing changes no global state; it checks that the installed PyTorch is not older
than :data:`TORCH_FLOOR` (:func:`check_torch`), and stops in one line if it is.
"""

import os
import re
from importlib.metadata import PackageNotFoundError, version

from helpers.system import check_platform, stop

PROFILES = ("full", "quick")
# The oldest PyTorch the course is tested with (`make test-floor` runs every test and lesson with it, from
# constraints-floor.txt); pyproject.toml and environment.yml say the same (tests/test_torch_floor.py checks).
TORCH_FLOOR = "2.11"


def _release(text: str) -> tuple[int, int, int]:
    """The numeric release a version string begins with, to three parts: ``"2.14.1+cpu"`` -> ``(2, 14, 1)``,
    ``"2.14"`` -> ``(2, 14, 0)``; ValueError for a string that begins with no number."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    if not match:
        raise ValueError(f"not a version: {text!r}")
    parts = [int(part) for part in match.group().split(".")] + [0, 0]
    return tuple(parts[:3])


def check_torch(installed: str | None = None) -> str:
    """Stop, in one line (:func:`helpers.system.stop`), when PyTorch is missing or older than
    :data:`TORCH_FLOOR`; return the version found. ``installed`` stands in for the installed version (tests).

    Reads the installed package's metadata, so this check does not import torch.
    """
    if installed is None:
        try:
            installed = version("torch")
        except PackageNotFoundError:
            stop(f"the course needs PyTorch {TORCH_FLOOR} or newer, and none is installed: "
                 f"pip install 'torch>={TORCH_FLOOR}'")
    if _release(installed) < _release(TORCH_FLOOR):
        stop(f"PyTorch {installed} is older than {TORCH_FLOOR}, the oldest the course is tested with: "
             f"pip install -U 'torch>={TORCH_FLOOR}' (the README's 'Which PyTorch' says more)")
    return installed


check_torch()


def course_profile() -> str:
    """The profile from ``COURSE_PROFILE``: ``"full"`` (default) or ``"quick"``; ValueError otherwise.

    Every lesson calls it first, so on native Windows, where the course cannot run, this is where a lesson
    stops, in one line that says to use WSL2 (:func:`helpers.system.check_platform`).
    """
    check_platform()
    profile = os.environ.get("COURSE_PROFILE", "full")
    if profile not in PROFILES:
        raise ValueError(f"COURSE_PROFILE={profile!r}: set it to 'full' or 'quick'")
    return profile
