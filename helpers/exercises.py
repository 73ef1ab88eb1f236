"""Exercises: the learner writes a lesson's distributed idea, and a check cell says whether it is right.

The format, the same in every lesson:

* In the committed notebook the reference solution stands in place, in a ``%%writefile`` script or in a
  notebook cell, between nbgrader's markers. The line above the markers names the exercise::

      # Exercise 01a: the ring all-reduce, from send and recv only
      ### BEGIN SOLUTION
      ...the reference code...
      ### END SOLUTION

  The id is the lesson's number and a letter; it is unique in the course.
* The exercise's check cell follows (it names the id). It prints one line when the code is right and
  raises :class:`ExerciseFailed` with one line when it is not, naming what differs: which rank, which
  element, expected against got, or which count. :func:`check_script` runs a script whose ranks check
  themselves; :func:`check` runs a function written in a notebook cell; :func:`verdict` turns a found
  problem (or ``None``) into that line.
* ``python -m helpers.exercises --out build/exercises`` (``make exercises``) writes the learner's version of
  every lesson that has exercises: each marked region replaced by one line that raises
  ``NotImplementedError`` naming the exercise (:func:`stub`). No later cell of a lesson depends on an
  exercise's result, so a learner version runs top to bottom except for the exercise checks.
* Tests show each check failing on the stub and on a plausible wrong answer (:func:`replace_solution`),
  without running the whole learner notebook.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TITLE = re.compile(r"^[ \t]*# Exercise (\d\d[a-z]): (.+)$")
REGION = re.compile(r"^([ \t]*)" + re.escape(BEGIN) + r"[ \t]*\n(.*?)^[ \t]*" + re.escape(END) + r"[ \t]*(?:\n|\Z)",
                    re.M | re.S)
LEARNER_NOTE = ("**This is the exercise version of the lesson.** Each exercise cell raises `NotImplementedError` "
                "until you write its code where it says so; the check cell after it then tells you, in one line, "
                "whether your code is right. Every other cell runs as it is. The reference solutions are in the "
                "course's own `notebooks/` folder.")


class ExerciseFailed(AssertionError):
    """An exercise's check found the learner's code wrong (or not written); the message is one line."""


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


def verdict(exercise: str, problem: str | None, passed: str = "correct") -> str:
    """Print and return ``Exercise X: <passed>`` when ``problem`` is None; raise :class:`ExerciseFailed` otherwise."""
    if problem:
        raise ExerciseFailed(f"Exercise {exercise}: {problem}")
    line = f"Exercise {exercise}: {passed}"
    print(line, flush=True)
    return line


def first_difference(expected, got, where: str = "", atol: float = 0.0) -> str | None:
    """None when tensors ``expected`` and ``got`` agree (exactly, or within ``atol``); else where they first differ.

    The answer names the place: ``"<where> element [2, 1]: expected 6.0, got 5.0"``, or the shapes when
    they differ.
    """
    import torch

    prefix = f"{where} " if where else ""
    expected, got = torch.as_tensor(expected), torch.as_tensor(got)
    if expected.shape != got.shape:
        return f"{prefix}shape: expected {tuple(expected.shape)}, got {tuple(got.shape)}"
    wrong = (expected.double() - got.double()).abs() > atol
    if not wrong.any():
        return None
    index = [int(i) for i in wrong.nonzero()[0]]
    return (f"{prefix}element {index}: expected {expected[tuple(index)].item():g}, got {got[tuple(index)].item():g}"
            f" ({int(wrong.sum())} of {wrong.numel()} elements differ)")


def _not_written(exercise: str, text: str) -> bool:
    return f"NotImplementedError: Exercise {exercise} " in text or f"NotImplementedError('Exercise {exercise} " in text


def check(exercise: str, run, passed: str = "correct") -> str:
    """Call ``run()``, which returns a problem (a string) or None, and give the verdict in one line.

    For an exercise written in a notebook cell: ``run`` calls the learner's function and compares.
    """
    try:
        problem = run()
    except NotImplementedError as e:
        if not _not_written(exercise, f"NotImplementedError: {e}"):
            raise
        raise ExerciseFailed(f"Exercise {exercise}: not written yet (its cell still raises NotImplementedError)") \
            from None
    return verdict(exercise, problem, passed)


def check_script(exercise: str, script, *args, timeout: float = 300, **kwargs) -> str:
    """Run a script whose ranks check exercise ``exercise``; return its verdict line, or raise it in one line.

    The script's ranks raise :class:`ExerciseFailed` (through :func:`verdict`) when they find the code wrong,
    and one rank prints the verdict when it is right. Keyword arguments go to
    :func:`helpers.launch.run_script`.
    """
    from helpers.launch import ScriptError, run_script

    try:
        run = run_script(script, *args, timeout=timeout, **kwargs)
    except ScriptError as e:
        text = f"{e}\n{e.output}"
        if _not_written(exercise, text):
            raise ExerciseFailed(f"Exercise {exercise}: not written yet (the script still raises "
                                 "NotImplementedError where the exercise goes)") from None
        failed = re.findall(r"ExerciseFailed: (Exercise " + exercise + r": .*)", text)
        if failed:
            raise ExerciseFailed(failed[0]) from None
        raise
    lines = [line for line in run.output.splitlines() if f"Exercise {exercise}: " in line]
    if not lines:
        raise ExerciseFailed(f"Exercise {exercise}: the script ended without a verdict")
    return lines[-1][lines[-1].index(f"Exercise {exercise}: "):]


def learner_notebook(path: Path) -> dict | None:
    """The learner's version of the lesson at ``path`` as notebook JSON, or None when it has no exercise."""
    nb = json.loads(Path(path).read_text())
    changed = False
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and BEGIN in source:
            cell["source"] = stub(source).splitlines(keepends=True)
            changed = True
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    if not changed:
        return None
    nb["cells"].insert(1, {"cell_type": "markdown", "metadata": {}, "source": [LEARNER_NOTE],
                           **({"id": "exercise-version"} if "id" in nb["cells"][0] else {})})
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the learner's version of each lesson: "
                                                 "every exercise's solution replaced by a NotImplementedError.")
    parser.add_argument("--out", type=Path, default=Path("build/exercises"), help="folder to write them into")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="folder of the NN_*.ipynb lessons")
    args = parser.parse_args(argv)
    if not args.notebooks.is_dir():
        parser.error(f"no folder {args.notebooks}")
    written = write_learner_notebooks(args.out, args.notebooks)
    for path in written:
        ids = [e for c in json.loads((args.notebooks / path.name).read_text())["cells"] if c["cell_type"] == "code"
               for e, _ in exercises("".join(c["source"]))]
        print(f"{path}: exercises {', '.join(ids)}")
    if not written:
        print(f"no lesson in {args.notebooks} has an exercise yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
