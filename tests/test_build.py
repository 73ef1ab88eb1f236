"""helpers.build (what `make course` runs) and the profile switch."""

import re
import subprocess
import sys

import nbformat
import pytest

import helpers

LESSON = [
    "from helpers.metrics import run_dir\nfrom helpers.plots import plot_curves\nimport helpers",
    "out = run_dir('99_tiny/run')\nplot_curves({'a': ([0, 1], [1, 0])}, 'tiny', 'step', 'loss', "
    "path=out / 'tiny.png')\nprint('profile', helpers.course_profile())",
    # a child process writes to the terminal it inherited from the kernel, not to the notebook
    "import subprocess, sys\n"
    "subprocess.run([sys.executable, '-c', 'import sys; print(\"child noise\", file=sys.stderr)'])",
]


def write_lesson(folder, name, cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / name)


def build(tmp_path, *flags):
    return subprocess.run([sys.executable, "-m", "helpers.build", "--out", str(tmp_path / "build"),
                           "--notebooks", str(tmp_path), *flags], capture_output=True, text=True, timeout=300)


def test_build_writes_notebook_html_figures_and_index(tmp_path):
    write_lesson(tmp_path, "99_tiny.ipynb", LESSON)
    done = build(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "build"
    executed = nbformat.read(out / "99_tiny.ipynb", as_version=4)
    assert any("profile" in o.get("text", "") for o in executed.cells[1].outputs)
    assert (out / "99_tiny.html").stat().st_size > 1000
    (figure,) = (out / "figures" / "99_tiny").glob("*.png")
    index = (out / "index.html").read_text()
    assert "99_tiny.html" in index and str(figure.relative_to(out)) in index
    assert f"Open {out / 'index.html'}" in done.stdout
    assert "child noise" not in done.stdout + done.stderr
    assert "child noise" in (out / "logs" / "99_tiny.log").read_text()
    assert re.search(r"^  99_tiny: cell 1/3, \d+ s$", done.stdout, re.M), "progress: which cell runs, since when"
    table = done.stdout.split("lesson ")[1]
    assert "99_tiny" in table and "no budget" in table


def test_budget_table_compares_each_lesson_with_its_budget():
    from helpers.build import budget_table

    rows = [dict(stem="00_orientation", seconds=50, ok=True), dict(stem="02_rl_rpc", seconds=400, ok=True),
            dict(stem="03_rnn", seconds=60, ok=False)]
    lines = budget_table(rows).splitlines()
    assert lines[1].split() == ["00_orientation", "0.8", "1", "within"]
    assert lines[2].split() == ["02_rl_rpc", "6.7", "6", "OVER"]
    assert lines[3].split()[-1] == "FAILED"
    assert lines[4].split() == ["all", "8.5", "10", "within"]


def test_failing_lesson_is_written_out_and_fails_the_build(tmp_path):
    write_lesson(tmp_path, "98_broken.ipynb", ["raise RuntimeError('lesson bug')"])
    done = build(tmp_path)
    assert done.returncode == 1
    assert "FAILED: RuntimeError: lesson bug" in done.stdout
    assert "lesson bug" in (tmp_path / "build" / "98_broken.html").read_text()


def test_unknown_lesson_is_refused(tmp_path):
    write_lesson(tmp_path, "99_tiny.ipynb", LESSON)
    done = build(tmp_path, "--only", "42_nothing")
    assert done.returncode == 2 and "no lesson named 42_nothing" in done.stderr


@pytest.mark.parametrize("value, expected", [(None, "full"), ("full", "full"), ("quick", "quick")])
def test_profile_comes_from_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("COURSE_PROFILE", raising=False)
    else:
        monkeypatch.setenv("COURSE_PROFILE", value)
    assert helpers.course_profile() == expected


def test_unknown_profile_is_refused(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "fast")
    with pytest.raises(ValueError, match="COURSE_PROFILE='fast': set it to 'full' or 'quick'"):
        helpers.course_profile()


def test_progress_counts_code_cells_only():
    import io

    import nbformat

    from helpers.build import Progress

    progress = Progress("99_tiny", cells=2, stream=io.StringIO())
    progress.cell_started(cell=nbformat.v4.new_markdown_cell("# title"))
    progress.cell_started(cell=nbformat.v4.new_code_cell("   "))  # nbclient skips empty cells
    progress.cell_started(cell=nbformat.v4.new_code_cell("x = 1"))
    assert progress.line().startswith("  99_tiny: cell 1/2,")


def test_a_lesson_can_write_another_lessons_scripts(tmp_path):
    from helpers.build import notebook_scripts, write_lesson_scripts

    written = write_lesson_scripts("01_ddp.ipynb", tmp_path / "scripts")
    assert "ddp_mnist.py" in [p.name for p in written]
    assert (tmp_path / "scripts" / "ddp_mnist.py").read_text() == notebook_scripts("01_ddp.ipynb")["ddp_mnist.py"]
    write_lesson(tmp_path, "99_tiny.ipynb", LESSON)
    assert write_lesson_scripts(tmp_path / "99_tiny.ipynb", tmp_path / "none") == []
