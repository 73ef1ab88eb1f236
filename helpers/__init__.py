"""Plumbing shared by the lessons of *Distributed PyTorch, hands-on*.

Modules: ``launch`` (start workers, run scripts), ``rpc`` (RRef method calls),
``metrics`` (per-rank JSON lines), ``plots`` (the course's figures),
``data`` (MNIST, online or the shipped subset), ``flags`` (argparse types with domains),
``checkpoint`` (atomic saves), ``compare`` (differences between tensors), ``system`` (what differs
between Linux, macOS and Windows), ``processes`` (torchrun agents, listening sockets, stack dumps),
``measure`` (lesson 05's timeline, page faults and allocator arenas), ``meters`` (lesson 09's bytes
per rank), ``anatomy`` (lesson 10's saved-activation bytes, collective log and profiler rows), ``startup``
(how long workers take to start with each start method: lesson 00, ``python -m helpers.startup``),
``build`` (what ``make course`` runs). Importing changes no global state.
"""

import os

from helpers.system import check_platform

PROFILES = ("full", "quick")


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
