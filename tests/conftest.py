"""Shared fixtures: lesson scripts taken from their notebooks, and a process-leak guard."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from helpers.build import notebook_scripts  # the lesson tests import it from here too

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


@pytest.fixture
def lesson_scripts(tmp_path, monkeypatch):
    """Write a notebook's scripts into a fresh folder; returns ``write(notebook) -> {name: Path}``.

    ``COURSE_RUNS`` points into the same temporary folder, so runs never touch the repository.
    """
    monkeypatch.setenv("COURSE_RUNS", str(tmp_path / "runs"))

    def write(notebook):
        paths = {}
        for name, source in notebook_scripts(notebook).items():
            paths[name] = tmp_path / name
            paths[name].write_text(source)
        assert paths, f"{notebook} writes no script"
        return paths

    return write


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every test must end with no child process of the test runner still running."""
    yield
    alive = [p for p in psutil.Process(os.getpid()).children(recursive=True)
             if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in alive:
        p.kill()
    assert not alive, f"processes outlived the test: {[p.cmdline() for p in alive]}"
