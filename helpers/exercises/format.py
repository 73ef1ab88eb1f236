"""The exercises' format: the markers around a solution, the learner's stub, the learner's version of a lesson,
and what makes a run an exercise run (the ``# Exercise NNx:`` line, or ``COURSE_EXERCISE``) with its short
timeout. Of the rest of :mod:`helpers` it imports only :mod:`helpers.lessons`: the launcher and the diagnosis read it
too."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

from helpers.lessons import NOTEBOOKS

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
TITLE = re.compile(r"^[ \t]*# Exercise (\d\d[a-z]): (.+)$", re.M)
REGION = re.compile(r"^([ \t]*)" + re.escape(BEGIN) + r"[ \t]*\n(.*?)^[ \t]*" + re.escape(END) + r"[ \t]*(?:\n|\Z)",
                    re.M | re.S)
LEARNER_NOTE = ("**This is the exercise version of the lesson.** Each exercise's code is replaced by a line that "
                "raises `NotImplementedError` naming the exercise: write your code there. The check cell after it "
                "tells you in one line whether your code is right, and never stops the run: no cell raises because "
                "an exercise is not written or wrong, so Run All goes to the end, where the last cell lists the "
                "exercises, passed or not. A cell that uses your code checks it first and leaves it out, in one "
                "line, when it is wrong. Keep this file outside the course's `notebooks/` folder (`make test` runs "
                "every notebook there), for instance in `build/exercises/`, where `make exercises` writes it. The "
                "reference solutions are in `notebooks/`.")
KEEP_GOING = ("# The exercise version: each check prints its verdict, right or wrong, and the run goes on to the last\n"
              "# cell, which lists the exercises (the course's own lessons stop at a wrong answer instead).\n"
              "from helpers.exercises import keep_going\n\nkeep_going()")


def exercises(source: str) -> list[tuple[str, str]]:
    """``[(id, title), ...]`` of the solution regions in ``source``, in order.

    ValueError when a region has no ``# Exercise NNx: title`` line right above its BEGIN marker, or when the
    markers do not pair up.
    """
    if source.count(BEGIN) != source.count(END):
        raise ValueError(f"{source.count(BEGIN)} '{BEGIN}' against {source.count(END)} '{END}'")
    found, lines = [], source.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == BEGIN:
            title = TITLE.match(lines[i - 1]) if i else None
            if not title:
                raise ValueError(f"the line above '{BEGIN}' must be '# Exercise NNx: what to write', "
                                 f"not {lines[i - 1] if i else '(nothing)'!r}")
            found.append((title.group(1), title.group(2).strip()))
    return found


def _stub_line(indent: str, exercise: str, title: str) -> str:
    message = f"Exercise {exercise} ({title}): not written yet; replace this line with your code"
    return f"{indent}raise NotImplementedError({message!r})\n"


def stub(source: str) -> str:
    """``source`` with each marked region (markers included) replaced by one ``raise NotImplementedError``."""
    names = iter(exercises(source))

    def one(match):
        exercise, title = next(names)
        return _stub_line(match.group(1), exercise, title)

    return REGION.sub(one, source)


def solution(source: str, exercise: str) -> str:
    """The code between the markers of ``exercise`` in ``source`` (markers excluded)."""
    ids = [e for e, _ in exercises(source)]
    if exercise not in ids:
        raise KeyError(f"no exercise {exercise} here (found {ids})")
    return list(REGION.finditer(source))[ids.index(exercise)].group(2)


def replace_solution(source: str, exercise: str, old: str | None = None, new: str = "") -> str:
    """``source`` with a different answer to ``exercise``: a wrong answer for a test of its check.

    With ``old``, that text (which must occur in the solution) is replaced by ``new`` inside the solution;
    without it, the whole solution becomes ``new`` (dedented text, indented as the solution is).
    """
    ids = [e for e, _ in exercises(source)]
    match = list(REGION.finditer(source))[ids.index(exercise)] if exercise in ids else None
    if match is None:
        raise KeyError(f"no exercise {exercise} here (found {ids})")
    body = match.group(2)
    if old is not None:
        if old not in body:
            raise ValueError(f"{old!r} is not in the solution of exercise {exercise}")
        body = body.replace(old, new)
    else:
        body = textwrap.indent(textwrap.dedent(new).strip("\n") + "\n", match.group(1))
    return source[:match.start(2)] + body + source[match.end(2):]


def not_written(exercise: str, text: str) -> bool:
    return f"NotImplementedError: Exercise {exercise} " in text or f"NotImplementedError('Exercise {exercise} " in text


# --- an exercise run: which exercise it checks, and how long a rank of it waits in one call ---------------

EXERCISE_ENV = "COURSE_EXERCISE"  # the id of the exercise a run checks (set by check_script, and by launch)
TIMEOUT_ENV = "COURSE_EXERCISE_TIMEOUT"  # seconds a rank of an exercise run waits in one call (default below)
EXERCISE_TIMEOUT = 30.0


def exercise_of_run(script=None) -> str | None:
    """The id of the exercise this run checks, or None when it is no exercise run.

    ``COURSE_EXERCISE`` when set (:func:`check_script` sets it, and a script whose exercise lives in a module it
    imports may set it itself, as lesson 01's ``allreduce_by_hand.py --design ring`` does); otherwise the first
    ``# Exercise NNx:`` line of the running script (``sys.argv[0]``), so that a learner's script run from a
    terminal is an exercise run too. A script that merely imports an exercise's module (a timing) is not one.
    """
    if os.environ.get(EXERCISE_ENV):
        return os.environ[EXERCISE_ENV]
    script = Path(script or (sys.argv[0] if sys.argv else "") or "-")
    if script.suffix != ".py" or not script.is_file():
        return None
    try:
        found = TITLE.search(script.read_text(errors="replace"))
    except OSError:
        return None
    return found.group(1) if found else None


def exercise_seconds() -> float:
    """How long a rank of an exercise run may wait in one call: ``COURSE_EXERCISE_TIMEOUT`` s, default 30."""
    return float(os.environ.get(TIMEOUT_ENV) or EXERCISE_TIMEOUT)


def exercise_timeout() -> timedelta | None:
    """The process-group timeout of an exercise run (:func:`exercise_seconds`), or None for any other run.

    :meth:`helpers.launch.Worker.init_process_group` passes it to ``dist.init_process_group``, so that a
    deadlock in a learner's code ends in seconds with a verdict, not after gloo's 30 minutes.
    """
    return timedelta(seconds=exercise_seconds()) if exercise_of_run() else None


# --- the learner's version of a lesson -------------------------------------------------------------------

def learner_notebook(path: Path) -> dict | None:
    """The learner's version of the lesson at ``path`` as notebook JSON, or None when it has no exercise."""
    nb = json.loads(Path(path).read_text())
    ids = []
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and BEGIN in source:
            ids += [e for e, _ in exercises(source)]
            cell["source"] = stub(source).splitlines(keepends=True)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    if not ids:
        return None
    with_id = "id" in nb["cells"][0]

    def new_cell(kind, source, name):
        made = {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True),
                **({"id": name} if with_id else {})}
        return made if kind == "markdown" else {**made, "execution_count": None, "outputs": []}

    colab = next((i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
                  and "google.colab" in "".join(c["source"])), 0)  # helpers import only after the Colab cell
    nb["cells"].insert(colab + 1, new_cell("code", KEEP_GOING, "exercise-keep-going"))
    nb["cells"].insert(1, new_cell("markdown", LEARNER_NOTE, "exercise-version"))
    nb["cells"].append(new_cell("markdown", "## Your exercises", "exercise-summary-title"))
    nb["cells"].append(new_cell("code", f"from helpers.exercises import summary\n\nsummary({ids!r});",
                            "exercise-summary"))
    return nb


def write_learner_notebooks(out: Path, notebooks: Path = NOTEBOOKS) -> list[Path]:
    """Write the learner's version of every lesson with exercises into ``out``; return the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb")):
        nb = learner_notebook(path)
        if nb is not None:
            written.append(out / path.name)
            written[-1].write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return written
