"""Checkpoints that a crash cannot break: the file on disk is always the old one or the new one."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def save_atomically(obj, path) -> Path:
    """``torch.save(obj)`` to ``path`` atomically; return the path.

    Writes a temporary file in the same folder, flushes it to the disk (``fsync``), renames it over
    ``path`` (``os.replace``: atomic within one file system), then flushes the folder so that the
    rename itself survives a power cut. A process killed at any moment leaves either the previous
    file or the new one, and at worst a stray ``.*.tmp`` file, never a half-written ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return path
