"""The notebooks as committed: clean, and each starting the same way. (nbmake executes them.)"""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_lessons():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_orientation.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    cells = json.loads(path.read_text())["cells"]
    dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_the_colab_install_cell(path):
    cells = json.loads(path.read_text())["cells"]
    first_code = next("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert 'if "google.colab" in sys.modules:' in first_code and "pip install" in first_code


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_scripts_are_written_to_the_ignored_scripts_folder(path):
    sources = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
    targets = [s.split()[1] for s in sources if s.startswith("%%writefile")]
    assert all(t.startswith("scripts/") for t in targets), targets


def test_no_two_notebooks_write_the_same_script():
    """Every %%writefile path is the course's own: two lessons open at once would otherwise run each other's."""
    writers = {}
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and source.startswith("%%writefile"):
                words = source.split()
                writers.setdefault(words[2] if words[1] == "-a" else words[1], set()).add(path.name)
    shared = {script: sorted(names) for script, names in writers.items() if len(names) > 1}
    assert not shared, f"scripts written by more than one notebook: {shared}"


def test_every_lesson_script_passes_the_linter(tmp_path):
    """ruff skips %%writefile cells in notebooks, so the scripts they write are linted here."""
    import subprocess
    import sys

    from helpers.build import write_lesson_scripts

    for path in NOTEBOOKS:
        write_lesson_scripts(path, tmp_path / path.stem)
    config = Path(__file__).resolve().parent.parent / "pyproject.toml"
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", str(config), "--ignore", "W292",
                           "--output-format", "concise", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
