"""Shared fixtures: lesson scripts taken from their notebooks, and a process-leak guard."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import helpers.launch
import helpers.runner
from helpers.exercises import check_script
from helpers.lessons import write_lesson_scripts

ROOT = Path(__file__).resolve().parent.parent
KERNELS = "COURSE_KERNELS"  # the folder of the kernel spec this run's notebooks use (set by the first process)
NOTEBOOKS = ROOT / "notebooks"


def pytest_configure(config):
    """One warm starter for the whole run (:func:`helpers.warm.share`): started by the first pytest process
    (the controller of ``-n 2``), it serves both workers and every lesson's Jupyter kernel, which would
    otherwise each start one and import torch in it again."""
    from helpers import kernel, warm

    if not os.environ.get(warm.SHARED):
        warm.share()
    # the lessons' kernels fork from that starter too (helpers.kernel), unless a kernel was asked for by name
    if os.environ.get(warm.SHARED) and getattr(config.option, "nbmake_kernel", "") is None and kernel.available():
        if not os.environ.get(KERNELS):
            os.environ[KERNELS] = tempfile.mkdtemp(prefix="course-kernels-")
            kernel.install_kernelspec(os.environ[KERNELS])
            os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [os.environ[KERNELS],
                                                                      os.environ.get("JUPYTER_PATH")]))
            config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(KERNELS), ignore_errors=True))
        config.option.nbmake_kernel = kernel.KERNEL_NAME


def pytest_collection_modifyitems(session, config, items):
    """Queue the notebooks, the longest items, in equal shares at the heads of the parts each worker starts on.

    ``make test`` runs pytest workers (pytest-xdist's worksteal) that start on equal consecutive parts of this
    list and take work from each other at the end: with every notebook in one part, one worker would run them
    all while the others ran out of tests. A notebook's weight is its lesson's time budget.
    """
    from helpers.build import BUDGET_MINUTES

    def weight(item):
        return BUDGET_MINUTES.get(Path(str(item.fspath)).name[:2], 1)

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    notebooks = sorted((i for i in items if str(i.fspath).endswith(".ipynb")), key=weight, reverse=True)
    rest = [i for i in items if not str(i.fspath).endswith(".ipynb")]
    shares, loads = [[] for _ in range(workers)], [0] * workers
    for item in notebooks:
        lighter = loads.index(min(loads))
        shares[lighter].append(item)
        loads[lighter] += weight(item)
    ordered, left = [], len(items)
    for i, share in enumerate(shares):  # xdist gives worker i len(left) // (workers - i) of the items left
        size = left // (workers - i)
        fill = max(size - len(share), 0)
        ordered += share + rest[:fill]
        rest, left = rest[fill:], left - len(share) - fill
    items[:] = ordered + rest


@pytest.fixture
def lesson_scripts(tmp_path, monkeypatch):
    """Write a notebook's scripts into a fresh folder; returns ``write(notebook) -> {name: Path}``.

    ``COURSE_RUNS`` points into the same temporary folder, so runs never touch the repository.
    """
    monkeypatch.setenv("COURSE_RUNS", str(tmp_path / "runs"))

    def write(notebook):
        paths = write_scripts(tmp_path, notebook)
        assert paths, f"{notebook} writes no script"
        return paths

    return write


def write_scripts(folder, *notebooks) -> dict[str, Path]:
    """Write the ``%%writefile`` scripts of ``notebooks`` into ``folder`` (later ones win a name); ``{name: path}``."""
    return {path.name: path for notebook in notebooks for path in write_lesson_scripts(notebook, folder)}


def check_source(exercise: str, path: Path, source: str, *flags, timeout=180) -> str:
    """Exercise ``exercise``'s check on ``source``, written to ``path`` first: its one-line verdict (a failed
    check raises :class:`helpers.exercises.ExerciseFailed` with it)."""
    path.write_text(source)
    return check_script(exercise, path, *flags, timeout=timeout, echo=False)


def run_in_this_process(script: Path, *flags, cwd=None, spawn=False) -> None:
    """Run a script's ``main()`` here, as ``python script flags`` would, without starting an interpreter.

    For flag checks: unless ``spawn``, ``launch()`` is a tripwire, so a check that lets bad input reach the
    point where workers would start fails the test. ``cwd`` is the folder to run in (default: unchanged).
    """
    def tripwire(*args, **kwargs):
        raise AssertionError(f"{script.name} {flags} got past its flag checks to launch()")

    threads = torch.get_num_threads()  # a script may set its own (one thread, on purpose): not for later tests
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(script.parent))
        if cwd is not None:
            patch.chdir(cwd)
        patch.setattr(sys, "argv", [script.name, *map(str, flags)])
        if not spawn:
            patch.setattr(helpers.launch, "launch", tripwire)
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            torch.set_num_threads(threads)


def refusal(script: Path, *flags, cwd=None) -> str:
    """Run ``script flags`` here (see :func:`run_in_this_process`), which must refuse them: exit code 2 before
    ``launch()``, and one line of error as the last line of stderr, which is returned."""
    err = io.StringIO()
    with pytest.raises(SystemExit) as refused, contextlib.redirect_stderr(err):
        run_in_this_process(script, *flags, cwd=cwd)
    lines = err.getvalue().strip().splitlines()
    assert refused.value.code == 2 and lines, f"{script.name} {flags}: exit code {refused.value.code}, {lines}"
    assert not any("Traceback" in line for line in lines), err.getvalue()
    return lines[-1]


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every test must end with no child process of the test runner still running."""
    yield
    alive = helpers.runner.running_children()
    for p in alive:
        p.kill()
    assert not alive, f"processes outlived the test: {[p.cmdline() for p in alive]}"


def code_cell(notebook: str, text: str) -> str:
    """The source of the one code cell of lesson ``notebook`` that contains ``text``."""
    sources = ["".join(c["source"]) for c in json.loads((NOTEBOOKS / notebook).read_text())["cells"]
               if c["cell_type"] == "code"]
    (found,) = [s for s in sources if text in s]
    return found


def run_exercise(exercise_cell: str, check_cell: str, space: dict | None = None) -> str:
    """Run an exercise's cell, then its check cell, as the notebook would (in ``space``); return the verdict line."""
    space = {} if space is None else space
    exec("import torch\nfrom helpers.exercises import check, first_difference", space)
    exec(exercise_cell, space)
    exec(check_cell.rstrip().rstrip(";").replace('check("', 'verdict = check("', 1), space)
    return space["verdict"]
