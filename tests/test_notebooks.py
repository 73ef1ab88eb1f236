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
    # no repository is written in: the learner (or build, from course_repository) fills COURSE_REPOSITORY
    assert 'COURSE_REPOSITORY = ""' in first_code and "git clone -q {COURSE_REPOSITORY}" in first_code
    assert "github.com" not in first_code.replace("https://github.com/OWNER/NAME", ""), first_code


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

    from helpers.lessons import write_lesson_scripts

    for path in NOTEBOOKS:
        write_lesson_scripts(path, tmp_path / path.stem)
    config = Path(__file__).resolve().parent.parent / "pyproject.toml"
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", str(config), "--ignore", "W292",
                           "--output-format", "concise", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def _exercise_cells(path):
    """``[(cell index, [(id, title), ...])]`` of a lesson's code cells that hold exercise solutions."""
    from helpers.exercises import exercises

    cells = json.loads(path.read_text())["cells"]
    return [(i, exercises("".join(c["source"]))) for i, c in enumerate(cells)
            if c["cell_type"] == "code" and exercises("".join(c["source"]))]


def test_exercises_are_well_formed_and_each_has_its_check_cell():
    """Ids are the lesson's number and a letter, unique; a later code cell (the check) names each id."""
    seen = set()
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        for index, found in _exercise_cells(path):
            for exercise, _ in found:
                assert exercise[:2] == path.name[:2], f"{path.name}: exercise {exercise} belongs to another lesson"
                assert exercise not in seen, f"exercise {exercise} appears twice"
                seen.add(exercise)
                later = ["".join(c["source"]) for c in cells[index + 1:] if c["cell_type"] == "code"]
                assert any(f'"{exercise}"' in s for s in later), f"{path.name}: no check cell names {exercise}"


def test_every_exercise_check_is_shown_failing_in_the_lessons_tests():
    """Each exercise id appears in its lesson's test file, where its check meets the stub and a wrong answer."""
    tests = Path(__file__).resolve().parent
    for path in NOTEBOOKS:
        for _, found in _exercise_cells(path):
            files = list(tests.glob(f"test_lesson{path.name[:2]}_*.py"))
            assert files, f"{path.name} has exercises but no tests/test_lesson{path.name[:2]}_*.py"
            text = "".join(f.read_text() for f in files)
            for exercise, _ in found:
                assert f'"{exercise}"' in text, f"no test of {path.name} names exercise {exercise}"


def test_learner_versions_compile(tmp_path):
    """The generated learner notebooks: every script and plain code cell is valid Python with its stub."""
    from helpers.exercises import BEGIN, write_learner_notebooks

    for written in write_learner_notebooks(tmp_path, NOTEBOOKS[0].parent):
        for cell in json.loads(written.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or "NotImplementedError" not in source:
                continue
            assert BEGIN not in source
            body = source.split("\n", 1)[1] if source.startswith("%%writefile") else source
            compile("\n".join(line for line in body.splitlines() if not line.lstrip().startswith(("%", "!"))),
                    written.name, "exec")
