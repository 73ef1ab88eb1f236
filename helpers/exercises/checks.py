"""The checks and their verdicts: one line starting ``Exercise NNx:``, printed when the learner's code is right,
raised as :class:`ExerciseFailed` when it is not (or, in a learner's version, printed and recorded:
:func:`keep_going`, :func:`summary`)."""

from __future__ import annotations

import re
import threading

from helpers.diagnose import crash_line, died_line, threads_line
from helpers.exercises.format import EXERCISE_ENV, exercise_seconds, not_written
from helpers.runner import ScriptError, ScriptTimeout, run_script

_RESULTS: dict[str, str] = {}  # {id: verdict line} of the checks run in this process, for summary()
_KEEP_GOING = False


class ExerciseFailed(AssertionError):
    """An exercise's check found the learner's code wrong (or not written); the message is one line."""


class Verdict(str):
    """A check's verdict line. It was printed already, so a notebook shows no second copy as the cell's value."""

    def _ipython_display_(self):
        pass


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
    they differ. A non-finite value (NaN, or an infinity where the other holds another value) is a difference.
    """
    import torch

    prefix = f"{where} " if where else ""
    expected, got = torch.as_tensor(expected), torch.as_tensor(got)
    if expected.shape != got.shape:
        return f"{prefix}shape: expected {tuple(expected.shape)}, got {tuple(got.shape)}"
    e, g = expected.double(), got.double()
    wrong = ~((e == g) | ((e - g).abs() <= atol))  # NaN is never equal, so a NaN answer is a difference
    if not wrong.any():
        return None
    index = [int(i) for i in wrong.nonzero()[0]]
    return (f"{prefix}element {index}: expected {expected[tuple(index)].item():g}, got {got[tuple(index)].item():g}"
            f" ({int(wrong.sum())} of {wrong.numel()} elements differ)")


def keep_going(on: bool = True) -> None:
    """In a learner's version: each check prints its verdict and returns, right or wrong, so that Run All goes
    on to the end, where :func:`summary` lists them. (The committed lessons never call it: their checks raise.)"""
    global _KEEP_GOING
    _KEEP_GOING = on


def summary(ids: list[str]) -> str:
    """Print and return a table of the exercises ``ids``: passed, failed (with its verdict) or not checked."""
    rows = []
    for exercise in ids:
        line = _RESULTS.get(exercise)
        state = "not run" if line is None else ("passed" if not line.startswith("FAILED") else "failed")
        detail = "" if line is None else line.removeprefix("FAILED ")
        rows.append(f"{exercise:<9} {state:<8} {detail}".rstrip())
    passed = sum(_RESULTS.get(e, "FAILED").startswith("Exercise") for e in ids)
    table = "\n".join([f"{'exercise':<9} {'result':<8} verdict", *rows, f"{passed} of {len(ids)} passed"])
    print(table, flush=True)
    return Verdict(table)


def _failed(line: str):
    """A check's failure: raised as :class:`ExerciseFailed`, or under :func:`keep_going` printed and recorded."""
    exercise = line.split(":", 1)[0].removeprefix("Exercise ")
    _RESULTS[exercise] = "FAILED " + line
    if _KEEP_GOING:
        print(line, flush=True)
        return Verdict(line)
    raise ExerciseFailed(line)


def _passed(exercise: str, line: str):
    _RESULTS[exercise] = line
    return Verdict(line)


def check(exercise: str, run, passed: str = "correct", timeout: float | None = None) -> str:
    """Call ``run()``, which returns a problem (a string) or None, and give the verdict in one line.

    For an exercise written in a notebook cell: ``run`` calls the learner's function and compares. It runs in a
    thread of its own for at most ``timeout`` seconds (default :func:`exercise_seconds`): when it (or a thread it
    started) has not finished by then, the verdict names each thread still running, the line it waits in, and the
    likely cause; the threads are left behind (a thread cannot be stopped), so the kernel stays usable. An error
    raised by the learner's code is a verdict too: its last line, and where.
    """
    timeout = exercise_seconds() if timeout is None else timeout
    before = set(threading.enumerate())
    box: dict = {}

    def target():
        try:
            box["problem"] = run()
        except BaseException as e:  # noqa: BLE001 (turned into the verdict below, in the caller's thread)
            box["error"] = e

    runner = threading.Thread(target=target, name=f"check-{exercise}", daemon=True)
    runner.start()
    runner.join(timeout)
    if runner.is_alive():
        others = [t for t in threading.enumerate() if t not in before and t is not runner and t.is_alive()]
        return _failed(threads_line(exercise, others or [runner], timeout))
    error = box.get("error")
    if isinstance(error, ExerciseFailed):
        return _failed(str(error))
    if isinstance(error, NotImplementedError) and not_written(exercise, f"NotImplementedError: {error}"):
        return _failed(f"Exercise {exercise}: not written yet (its cell still raises NotImplementedError)")
    if error is not None:
        import traceback

        text = "".join(traceback.format_exception(error))
        return _failed(crash_line(exercise, 0, text).replace(" rank 0 crashed", " your code raised", 1))
    try:
        line = verdict(exercise, box.get("problem"), passed)
    except ExerciseFailed as e:
        return _failed(str(e))
    return _passed(exercise, line)


def check_script(exercise: str, script, *args, timeout: float = 300, **kwargs) -> str:
    """Run a script whose ranks check exercise ``exercise``; return its verdict line, or raise it in one line.

    The script's ranks raise :class:`ExerciseFailed` (through :func:`verdict`) when they find the code wrong,
    and one rank prints the verdict when it is right. Every other way the run can fail ends in one line starting
    ``Exercise <id>:`` too: a deadlock (the run's process groups time out after :func:`exercise_seconds`, and
    the line says where each rank waited), a rank's crash or abort, the script not finishing within ``timeout``.
    Keyword arguments go to :func:`helpers.runner.run_script`.
    """
    passed, line = _run_check(exercise, script, args, timeout, kwargs)
    return _passed(exercise, line) if passed else _failed(line)


def failure_of(exercise: str, script, *args, timeout: float = 300, **kwargs) -> str | None:
    """What :func:`check_script` would say is wrong, or None when the check passes; it prints nothing and counts
    for no summary. For a cell that uses the learner's code: check it first, cheaply, and leave it out if wrong."""
    passed, line = _run_check(exercise, script, args, timeout, {"echo": False, **kwargs})
    return None if passed else line


def _run_check(exercise: str, script, args, timeout: float, kwargs: dict) -> tuple[bool, str]:
    env = {**(kwargs.pop("env", None) or {}), EXERCISE_ENV: exercise}
    try:
        run = run_script(script, *args, timeout=timeout, env=env, **kwargs)
    except ScriptTimeout:
        return False, (f"Exercise {exercise}: did not finish within {timeout:g} s and was stopped (no rank timed "
                       "out in a torch.distributed call: a loop that never ends, or a wait outside them)")
    except ScriptError as e:
        return False, _script_failure(exercise, str(e), e.output)
    lines = [line for line in run.output.splitlines() if f"Exercise {exercise}: " in line]
    if not lines:
        return False, f"Exercise {exercise}: the script ended without a verdict"
    return True, lines[-1][lines[-1].index(f"Exercise {exercise}: "):]


def _script_failure(exercise: str, message: str, output: str) -> str:
    """The one line of a failed exercise script, from what it printed."""
    if not_written(exercise, f"{message}\n{output}"):
        return (f"Exercise {exercise}: not written yet (the script still raises NotImplementedError where the "
                "exercise goes)")
    mark = re.compile(r"^(?:.*ExerciseFailed: )?(Exercise " + re.escape(exercise) + r": .*)$", re.M)
    failed = re.findall(r"ExerciseFailed: (Exercise " + re.escape(exercise) + r": .*)", output)
    found = mark.findall(output)
    line = failed[-1] if failed else (found[-1] if found else None)
    if line is not None and "died (" in line and "what():" not in line:  # a C++ abort: its words are above
        died = re.search(r"rank (\d+) died \((?:signal \w+, )?exit code (-?\d+)\)", line)
        if died:
            line = died_line(exercise, int(died.group(1)), int(died.group(2)), output)
    if line is None:
        first = message.splitlines()[0] if message else "it failed"
        line = f"Exercise {exercise}: the script failed: {first[:300]}"
    return line
