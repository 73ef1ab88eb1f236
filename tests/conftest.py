"""Shared fixtures: lesson scripts taken from their notebooks, and a process-leak guard."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
WRITEFILE = re.compile(r"^%%writefile\s+(?:-a\s+)?(\S+)\s*\n")


def notebook_scripts(notebook: str | Path) -> dict[str, str]:
    """``{file name: source}`` of every ``%%writefile`` cell in a notebook, in cell order."""
    cells = json.loads(Path(NOTEBOOKS, notebook).read_text())["cells"]
    scripts = {}
    for cell in cells:
        source = "".join(cell["source"])
        match = WRITEFILE.match(source)
        if cell["cell_type"] == "code" and match:
            scripts[Path(match.group(1)).name] = source[match.end():]
    return scripts


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
