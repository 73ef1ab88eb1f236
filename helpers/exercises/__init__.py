"""Exercises: the learner writes a lesson's distributed idea, and a check cell says whether it is right.

The format, the same in every lesson (:mod:`helpers.exercises.format`):

* In the committed notebook the reference solution stands in place, in a ``%%writefile`` script or in a
  notebook cell, between nbgrader's markers. The line above the markers names the exercise::

      # Exercise 01a: the ring all-reduce, from send and recv only
      ### BEGIN SOLUTION
      ...the reference code...
      ### END SOLUTION

  The id is the lesson's number and a letter; it is unique in the course.
* The exercise's check cell follows (it names the id). It prints one line when the code is right and
  raises :class:`ExerciseFailed` with one line when it is not, naming what differs: which rank, which
  element, expected against got, or which count (:mod:`helpers.exercises.checks`). :func:`check_script` runs a
  script whose ranks check themselves; :func:`check` runs a function written in a notebook cell; :func:`verdict`
  turns a found problem (or ``None``) into that line.
* ``python -m helpers.exercises --out build/exercises`` (``make exercises``) writes the learner's version of
  every lesson that has exercises: each marked region replaced by one line that raises
  ``NotImplementedError`` naming the exercise (:func:`stub`), a cell after the setup that makes every check
  print its verdict and let the run go on (:func:`keep_going`), and a last cell that lists the exercises,
  passed or not (:func:`summary`). So a learner version runs to its end under Run All; the committed lessons
  never call :func:`keep_going`, and their checks raise.
* ``python -m helpers.exercises --nbgrader DIR`` (``make nbgrader``) writes an nbgrader course directory
  (:mod:`helpers.exercises.nbgrader`): solution cells, locked graded check cells, every other code cell locked.
* Every way an exercise can fail ends in one line starting ``Exercise NNx:``, within seconds: a wrong value
  (a non-finite one included: :func:`first_difference`), a crash of a rank (its rank, line and error's last
  line) or its abort, a deadlock, an RPC that never returns, an in-notebook check whose threads never finish.
  An exercise run (a check's, or a script holding an ``# Exercise NNx:`` line) gives its process
  groups and RPC calls a short timeout (:func:`helpers.exercises.format.exercise_seconds`, from a terminal too),
  and when a rank times out the verdict says where each rank waited (:mod:`helpers.diagnose`).
* Tests show each check failing on the stub and on a plausible wrong answer (:func:`replace_solution`),
  without running the whole learner notebook.

This module names the public API that lessons and tests use. Each name is loaded from its module on first use,
so that importing :mod:`helpers.exercises.format` (the launcher and the diagnosis do) does not import the checks,
which import the launcher's neighbours in turn.
"""

from importlib import import_module

_WHERE = {
    "format": ("BEGIN", "END", "exercises", "stub", "solution", "replace_solution", "write_learner_notebooks",
               "exercise_of_run", "exercise_seconds", "exercise_timeout", "EXERCISE_ENV", "TIMEOUT_ENV"),
    "checks": ("ExerciseFailed", "check", "check_script", "failure_of", "verdict", "first_difference", "summary",
               "keep_going"),
    "nbgrader": ("write_nbgrader", "nbgrader_notebook"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'helpers.exercises' has no attribute {name!r}")
    value = getattr(import_module(f"helpers.exercises.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
