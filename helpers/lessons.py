"""The lessons as files: where they are, the scripts each writes with ``%%writefile`` (so that one lesson or a
test can run another's scripts without running that lesson), which cells run and which are checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


WRITEFILE = re.compile(r"^%%writefile\s+(?:-a\s+)?(\S+)\s*\n")


def runs(cell) -> bool:
    """True for a cell that a kernel executes: a code cell with some source."""
    return cell["cell_type"] == "code" and bool("".join(cell["source"]).strip())


def is_check(cell) -> bool:
    """A check cell: a code cell that asserts or gives an exercise's verdict (not a ``%%writefile`` cell,
    whose asserts belong to a script)."""
    source = "".join(cell["source"])
    return runs(cell) and not WRITEFILE.match(source) and \
        re.search(r"^\s*(assert\b|(check|check_script|verdict)\()", source, re.M) is not None


def notebook_scripts(notebook) -> dict[str, str]:
    """``{file name: source}`` of every ``%%writefile`` cell of a lesson, in cell order.

    ``notebook`` is a path, or a lesson's file name in ``notebooks/`` (e.g. ``"02_ddp.ipynb"``).
    """
    path = Path(notebook) if Path(notebook).is_file() else NOTEBOOKS / notebook
    scripts = {}
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        match = WRITEFILE.match(source)
        if cell["cell_type"] == "code" and match:
            scripts[Path(match.group(1)).name] = source[match.end():]
    return scripts


def write_lesson_scripts(notebook, folder="scripts") -> list[Path]:
    """Write a lesson's ``%%writefile`` scripts into ``folder``, as running its cells would; return their paths.

    Lets one lesson run another's scripts without the learner having run that lesson first.
    """
    written = []
    for name, source in notebook_scripts(notebook).items():
        written.append(Path(folder, name))
        written[-1].parent.mkdir(parents=True, exist_ok=True)
        written[-1].write_text(source)
    return written
