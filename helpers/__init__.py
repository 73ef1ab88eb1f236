"""Plumbing shared by the lessons of *Distributed PyTorch, hands-on*.

Modules: ``launch`` (start workers, run scripts), ``rpc`` (RRef method calls),
``metrics`` (per-rank JSON lines), ``plots`` (the course's figures),
``data`` (MNIST, online or the shipped subset). Importing changes no global state.
"""

import os

PROFILES = ("full", "quick")


def course_profile() -> str:
    """The profile from ``COURSE_PROFILE``: ``"full"`` (default) or ``"quick"``; ValueError otherwise."""
    profile = os.environ.get("COURSE_PROFILE", "full")
    if profile not in PROFILES:
        raise ValueError(f"COURSE_PROFILE={profile!r}: set it to 'full' or 'quick'")
    return profile
