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
  ``NotImplementedError`` naming the exercise (:func:`stub`), a cell after the setup that makes every check
  print its verdict and let the run go on (:func:`keep_going`), and a last cell that lists the exercises,
  passed or not (:func:`summary`). So a learner version runs to its end under Run All; the committed lessons
  never call :func:`keep_going`, and their checks raise.
* ``python -m helpers.exercises --nbgrader DIR`` (``make nbgrader``) writes an nbgrader course directory
  (:func:`write_nbgrader`): solution cells, locked graded check cells, every other code cell locked.
* Every way an exercise can fail ends in one line starting ``Exercise NNx:``, within seconds: a wrong value
  (a non-finite one included: :func:`first_difference`), a crash of a rank (its rank, line and error's last
  line) or its abort, a deadlock, an RPC that never returns, an in-notebook check whose threads never finish.
  An exercise run (a check's, or a script holding an ``# Exercise NNx:`` line) gives its process
  groups and RPC calls a short timeout (:func:`exercise_seconds`, from a terminal too), and when a rank times
  out the verdict says where each rank waited (its traceback, or a ``py-spy dump`` of a rank still waiting, cut
  to the learner's files) with one hint of the usual cause (:func:`watch_ranks`, :func:`failure_line`).
* Tests show each check failing on the stub and on a plausible wrong answer (:func:`replace_solution`),
  without running the whole learner notebook.
"""

from __future__ import annotations

import argparse
import json
import linecache
import os
import re
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
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


def _not_written(exercise: str, text: str) -> bool:
    return f"NotImplementedError: Exercise {exercise} " in text or f"NotImplementedError('Exercise {exercise} " in text


# --- the verdict of every way an exercise can fail ------------------------------------------------------------

EXERCISE_ENV = "COURSE_EXERCISE"  # the id of the exercise a run checks (set by check_script, and by launch)
TIMEOUT_ENV = "COURSE_EXERCISE_TIMEOUT"  # seconds a rank of an exercise run waits in one call (default below)
EXERCISE_TIMEOUT = 30.0
_RESULTS: dict[str, str] = {}  # {id: verdict line} of the checks run in this process, for summary()
_KEEP_GOING = False


class Verdict(str):
    """A check's verdict line. It was printed already, so a notebook shows no second copy as the cell's value."""

    def _ipython_display_(self):
        pass


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


FRAME_PY_SPY = re.compile(r"^\s+(?P<function>\S+) \((?P<file>[^()]+?):(?P<line>\d+)\)\s*$", re.M)
FRAME_TRACEBACK = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)', re.M)
TIMEOUT_WORDS = re.compile(r"timed out|timeout|time out", re.I)


def _frames(text: str, folder: Path | None = None, served: bool = False) -> list[tuple[str, int, str]]:
    """``[(file, line, function), ...]`` from the outermost call to the innermost, in a Python traceback or in a
    ``py-spy dump`` (innermost first, thread by thread): its main thread's, or with ``served`` the first other
    thread running the learner's code (a function that an RPC runs), if there is one."""
    if "Traceback (most recent call last)" in text:
        return [(m["file"], int(m["line"]), m["function"]) for m in FRAME_TRACEBACK.finditer(text)]
    threads = [[(m["file"], int(m["line"]), m["function"]) for m in FRAME_PY_SPY.finditer(t)][::-1]
               for t in text.split("\nThread ")[1:]] or [[]]
    if served:
        for frames in threads[1:]:
            if any(_learner_file(file, folder) for file, _, _ in frames):
                return frames
    return threads[0]


_LIBRARY = tuple({str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, Path(__file__).parent)})


def _learner_file(file: str, folder: Path | None) -> bool:
    """True for a file of the learner's: in the script's ``folder``; without one, a notebook cell's code or any
    file that is neither Python's, an installed package's, nor the course's helpers."""
    path = Path(file)
    if folder is not None:
        return path.parent == folder or not path.is_absolute() and len(path.parts) == 1
    if file.startswith("<"):
        return file.startswith(("<cell", "<ipython-input"))
    return not str(path.resolve()).startswith(_LIBRARY)


def _code(line: str) -> str:
    """A line of code without its indentation and its trailing comment."""
    return re.sub(r"\s+#\s.*$", "", line.strip()) if "'" not in line and '"' not in line else line.strip()


def _source_line(file: str, line: int, folder: Path | None) -> str:
    path = Path(file)
    if not path.is_absolute() and folder is not None:
        path = folder / path.name
    text = _code(linecache.getline(str(path), line))
    return text if len(text) <= 70 else text[:67] + "..."


def where_waiting(text: str, folder: Path | None = None, served: bool = False) -> dict | None:
    """Where a stack (a traceback or a py-spy dump) waits, cut to the learner's own frames:
    ``{"file", "line", "code", "function", "call", "calls"}``, ``call`` being the innermost function below the
    learner's frame (``recv``, ``barrier``, ...) and ``calls`` every function of the stack; None without one."""
    frames = _frames(text, folder, served)
    mine = [i for i, (file, _, _) in enumerate(frames) if _learner_file(file, folder)]
    if not mine:
        return None
    exercise_files = [i for i in mine if TITLE.search("".join(linecache.getlines(_resolve(frames[i][0], folder))))]
    i = (exercise_files or mine)[-1]
    file, line, function = frames[i]
    below = [f for f in frames[i + 1:] if not _learner_file(f[0], folder)]
    return {"file": Path(file).name, "line": line, "code": _source_line(file, line, folder), "function": function,
            "call": below[-1][2] if below else "", "calls": {f[2] for f in frames[i + 1:]}}


def _resolve(file: str, folder: Path | None) -> str:
    path = Path(file)
    return str(folder / path.name) if not path.is_absolute() and folder is not None else file


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _deadlock_hint(places: list[dict]) -> str:
    calls = [p["call"] or ("wait" if ".wait(" in p["code"] else "") for p in places]
    kinds = {"recv" if c in ("recv", "irecv") else c for c in calls}
    if kinds == {"recv"}:
        return ("every rank waits to receive before any rank has sent: start the send first (isend), then "
                "recv, then wait() the send")
    if kinds == {"send"}:
        return ("on gloo a blocking send waits until the receiver takes the message, and every rank is sending: "
                "start the sends with isend and post the receives before you wait() on them")
    if kinds <= {"send", "recv"}:
        return "a send and a recv do not pair up: each send needs the matching recv on its peer, in the same order"
    if "wait" in kinds:
        return "a wait() on a message whose peer never posts the matching send or recv"
    if len(kinds) > 1:
        return "the ranks are in different calls: every rank must call the same collectives in the same order"
    return "a rank waits for a message or collective its peers never start (a rank skipped it, or waits first)"


def deadlock_line(exercise: str, stacks: dict, seconds: float | None = None, folder: Path | None = None,
                  rpc: bool = False) -> str:
    """The one-line verdict of a run whose ranks stopped waiting at the timeout: where each rank waited (from
    ``stacks``, ``{rank: traceback or py-spy dump}``) and one hint of the usual cause."""
    places = {rank: where_waiting(text, folder, served=rpc) for rank, text in sorted(stacks.items())}
    groups: dict[tuple, list[int]] = {}
    for rank, place in places.items():
        key = (place["file"], place["line"], place["code"]) if place else None
        groups.setdefault(key, []).append(rank)
    parts = []
    for key, ranks in groups.items():
        if key is None:
            parts.append(f"{_ranks(ranks)}: no stack")
            continue
        verb = "wait" if len(ranks) == 1 else ("both wait" if len(ranks) == 2 else "all wait")
        verb = "waits" if len(ranks) == 1 else verb
        parts.append(f"{_ranks(ranks)} {verb} in `{key[2]}` ({key[0]} line {key[1]})")
    after = f" after {seconds:g} s" if seconds else ""
    known = [p for p in places.values() if p]
    if rpc:
        what, hint = (f"an RPC did not return{after}",
                      "the remote function waits for something that never happens (a lock it already holds, a "
                      "reply from the rank that is waiting for it) or never ends")
    else:
        what, hint = f"deadlock, no rank went on{after}", _deadlock_hint(known)
    return f"Exercise {exercise}: {what}: {'; '.join(parts) or 'no stack of any rank'}. Hint: {hint}"


def crash_line(exercise: str, rank: int, text: str, folder: Path | None = None) -> str:
    """The one-line verdict of rank ``rank`` raising: the last line of its error, and the learner's line."""
    failed = re.findall(r"ExerciseFailed: (Exercise " + re.escape(exercise) + r": .*)", text)
    if failed:
        return failed[-1]
    if _not_written(exercise, text):
        return (f"Exercise {exercise}: not written yet (the script still raises NotImplementedError where the "
                "exercise goes)")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "(no message)"
    place = where_waiting(text, folder)
    at = f" at `{place['code']}` ({place['file']} line {place['line']})" if place else ""
    return f"Exercise {exercise}: rank {rank} crashed{at}: {last[:300]}"


def died_line(exercise: str, rank: int, exit_code: int, output: str = "") -> str:
    """The one-line verdict of rank ``rank`` dying without a Python error (a C++ abort: gloo's, for one)."""
    import signal

    try:
        name = f"signal {signal.Signals(-exit_code).name}, " if exit_code < 0 else ""
    except ValueError:
        name = ""
    words = [re.sub(r"^what\(\):\s*(\[[^\]]*\]\s*)?", "", line.strip()) for line in output.splitlines()
             if "what():" in line or "terminate called" in line]
    last = f": {words[-1] if len(words[-1]) <= 200 else words[-1][:197] + '...'}" if words else ""
    hint = ""
    if "nbytes" in last or "length" in last:
        hint = (" Hint: a recv into a tensor smaller than the message sent (gloo aborts); sender and receiver must "
                "agree on each message's size, also when N does not divide the tensor")
    end = "" if last[-1:] in ".?!" else "."
    return f"Exercise {exercise}: rank {rank} died ({name}exit code {exit_code}){last}{end}{hint}"


CONSEQUENCE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe", re.I)


def _last_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[-1] if (text or "").strip() else ""


def failure_line(exercise: str, report: dict, folder: Path | None = None, output: str = "") -> str:
    """The one verdict line of an exercise run that ended with a rank failing, from :func:`watch_ranks`'s
    ``report``: where each rank waited when they timed out, else the failing rank's error or death."""
    if report.get("stacks"):
        rpc = any("RPC" in _last_line(t) for t in report["stacks"].values() if "Traceback" in t)
        return deadlock_line(exercise, report["stacks"], exercise_seconds(), folder, rpc=rpc)
    if report.get("text") is None:
        return died_line(exercise, report["rank"], report.get("exit") or 0, output)
    return crash_line(exercise, report["rank"], report["text"], folder)


def watch_ranks(context, grace: float = 2.0) -> dict:
    """Wait for the processes of a ``torch.multiprocessing`` context until one fails or all succeed; ``{}`` when
    all succeed. On a failure, before it ends the others, say what happened: ``{"rank", "text", "exit", "stacks"}``,
    the rank that failed first for a reason of its own (not a peer closing the connection), its traceback (None
    when it died without one) and exit code, and when a rank timed out, ``stacks``: ``{rank: stack}`` of every
    rank, its traceback or, for a rank still waiting, a py-spy dump. For :func:`helpers.launch.launch`'s exercise
    runs."""
    import contextlib
    import io
    import pickle
    from multiprocessing.connection import wait

    from helpers.measure.process import py_spy_dumps

    waiting = {p.sentinel: i for i, p in enumerate(context.processes)}
    order: list[int] = []  # the ranks that failed, in the order they ended
    while waiting and not order:
        for sentinel in wait(list(waiting)):
            index = waiting.pop(sentinel)
            context.processes[index].join()
            if context.processes[index].exitcode != 0:
                order.append(index)
    if not order:
        return {}
    deadline = time.monotonic() + grace  # a peer's timeout or error comes about now: let it write its own
    while waiting and time.monotonic() < deadline:
        for sentinel in wait(list(waiting), timeout=max(0.0, deadline - time.monotonic())):
            index = waiting.pop(sentinel)
            context.processes[index].join()
            if context.processes[index].exitcode != 0:
                order.append(index)

    def traceback_of(index):
        try:
            with open(context.error_files[index], "rb") as fh:
                return pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError, TypeError):
            return None

    texts = {index: traceback_of(index) for index in order}
    rank = next((i for i in order if texts[i] and not CONSEQUENCE.search(_last_line(texts[i]))), order[0])
    report = {"rank": rank, "text": texts[rank], "exit": context.processes[rank].exitcode, "stacks": {}}
    if any(TIMEOUT_WORDS.search(_last_line(t)) for t in texts.values() if t):
        for index, process in enumerate(context.processes):
            if process.is_alive():
                with contextlib.redirect_stdout(io.StringIO()):  # a rank may end in between: no line about it
                    dump = py_spy_dumps({index: process.pid})
                if dump:
                    report["stacks"][index] = dump[index]
            elif texts.get(index):
                report["stacks"][index] = texts[index]
    return report


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


def _threads_line(exercise: str, threads: list, seconds: float) -> str:
    """The verdict of an in-notebook check whose threads did not finish: where each waits, and the likely cause."""
    frames = sys._current_frames()
    found = []  # (cause, where, thread name)
    for thread in threads:
        stack, frame = [], frames.get(thread.ident)
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        mine = [f for f in stack if _learner_file(f.f_code.co_filename, None)]  # innermost first
        if not mine:
            found.append(("", ("", 0, "", ""), thread.name))
            continue
        inner = mine[0]
        code = _code(linecache.getline(inner.f_code.co_filename, inner.f_lineno))
        caller = f", called from `{mine[1].f_code.co_name}`" if len(mine) > 1 else ""
        found.append((_stuck_cause(code, mine), (inner.f_code.co_name, inner.f_lineno, code, caller), thread.name))
    found.sort(key=lambda f: "again" not in f[0])  # a thread that waits for itself first: it holds the others up
    groups: dict[tuple, list[str]] = {}
    for _, where, name in found:
        groups.setdefault(where, []).append(name)
    causes = [cause for cause, _, _ in found]
    parts = []
    for (function, line, code, caller), names in groups.items():
        who = f"thread {names[0]} waits" if len(names) == 1 else f"{len(names)} threads ({', '.join(names)}) wait"
        parts.append(f"{who} in `{code}` (`{function}`, line {line} of its cell{caller})" if code
                     else f"{who}: no frame of the notebook's")
    cause = next((c for c in causes if "again" in c), next((c for c in causes if c), "a thread waits for "
                 "something no other thread will do, or loops without end"))  # the thread that waits for itself
    return (f"Exercise {exercise}: did not finish within {seconds:g} s: {'; '.join(parts)}. Likely cause: {cause}")


def _stuck_cause(code: str, mine: list) -> str:
    held = re.search(r"with\s+([\w.\[\]]+)\s*:|([\w.\[\]]+)\.acquire\(", code)
    if held:
        lock = held.group(1) or held.group(2)
        for outer in mine[1:]:
            lines = linecache.getlines(outer.f_code.co_filename)
            body = lines[outer.f_code.co_firstlineno - 1:outer.f_lineno]
            if any(re.search(r"with\s+" + re.escape(lock) + r"\s*:|" + re.escape(lock) + r"\.acquire\(", b)
                   for b in body):
                return (f"`{outer.f_code.co_name}` holds {lock} and calls `{mine[0].f_code.co_name}`, which takes it "
                        f"again: a threading.Lock is not re-entrant, so the thread waits for itself (take the lock "
                        f"once, and do what `{mine[0].f_code.co_name}` does inside it without calling it)")
        return f"{lock} is held by a thread that never releases it"
    if ".join(" in code:
        return "it waits for a thread that never ends"
    return ""


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
        return _failed(_threads_line(exercise, others or [runner], timeout))
    error = box.get("error")
    if isinstance(error, ExerciseFailed):
        return _failed(str(error))
    if isinstance(error, NotImplementedError) and _not_written(exercise, f"NotImplementedError: {error}"):
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
    Keyword arguments go to :func:`helpers.launch.run_script`.
    """
    passed, line = _run_check(exercise, script, args, timeout, kwargs)
    return _passed(exercise, line) if passed else _failed(line)


def failure_of(exercise: str, script, *args, timeout: float = 300, **kwargs) -> str | None:
    """What :func:`check_script` would say is wrong, or None when the check passes; it prints nothing and counts
    for no summary. For a cell that uses the learner's code: check it first, cheaply, and leave it out if wrong."""
    passed, line = _run_check(exercise, script, args, timeout, {"echo": False, **kwargs})
    return None if passed else line


def _run_check(exercise: str, script, args, timeout: float, kwargs: dict) -> tuple[bool, str]:
    from helpers.launch import ScriptError, ScriptTimeout, run_script

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
    if _not_written(exercise, f"{message}\n{output}"):
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


# --- an nbgrader course directory -------------------------------------------------------------------------------

CHECK_CALL = re.compile(r"""^\s*(?:\w+\s*=\s*)?(?:check|check_script)\(\s*["'](\d\d[a-z])["']""", re.M)
NBGRADER_CONFIG = """# Written by `python -m helpers.exercises --nbgrader`: the lessons as nbgrader assignments.
c = get_config()  # noqa: F821 (nbgrader's config loader defines it)
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = "distributed-pytorch-hands-on"
c.ExecutePreprocessor.timeout = 900  # a check cell runs a script of several ranks
c.Execute.timeout = 900
"""


def _statement_names(node) -> tuple[set, set]:
    """(names a statement defines, names it reads)."""
    import ast

    defined, used = set(), set()
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
        defined.add(node.name)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (defined if isinstance(sub.ctx, ast.Store) else used).add(sub.id)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in sub.names}
    return defined, used


SETUP_MODULES = {"os", "sys", "warnings", "logging", "torch", "random", "np"}


def _trim(source: str, wanted: set) -> tuple[str | None, set]:
    """The statements of a cell that the cells after it need: those defining a name in ``wanted``, imports, and
    calls into a module that set things up (``os.makedirs(...)``, ``sys.path.insert(...)``);
    ``(None, wanted)`` when none is needed, else ``(their source, wanted as it stands before the cell)``. A cell
    Python cannot parse (IPython's ``!`` and ``%`` lines) is kept whole."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source, wanted
    lines, kept = source.splitlines(keepends=True), []
    for node in reversed(tree.body):
        defined, used = _statement_names(node)
        call = node.value.func if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else None
        while isinstance(call, ast.Attribute):
            call = call.value
        plain = isinstance(call, ast.Name) and call.id in SETUP_MODULES  # os.makedirs(...), torch.manual_seed(...)
        if defined & wanted or isinstance(node, (ast.Import, ast.ImportFrom)) or plain:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.insert(0, "".join(lines[first - 1:node.end_lineno]))
            wanted = (wanted - defined) | used
    return ("".join(kept) if kept else None), wanted


def _free_names(source: str) -> set:
    """The names a cell reads before (or without) defining them."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    wanted = set()
    for node in reversed(tree.body):
        defined, used = _statement_names(node)
        wanted = (wanted - defined) | used
    return wanted


def nbgrader_notebook(path: Path, checks_only: bool = False) -> dict | None:
    """Lesson ``path`` as an nbgrader source notebook, or None when it has no exercise.

    Each cell holding a solution region is a solution cell; each cell that calls ``check``/``check_script`` for
    an exercise is a graded test cell (1 point, locked: it passes when the check raises nothing); every other
    code cell is locked (read-only). ``checks_only`` keeps only what the checks need: the title, the
    exercises' text, the ``%%writefile`` cells, and the code cells that define a name a kept cell reads.
    """
    nb = json.loads(Path(path).read_text())
    cells = nb["cells"]
    kinds = []
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code":
            kinds.append("markdown")
        elif BEGIN in source:
            kinds.append("solution")
        elif CHECK_CALL.search(source):
            kinds.append("test")
        else:
            kinds.append("code")
    if "solution" not in kinds:
        return None
    keep = [True] * len(cells)
    if checks_only:
        wanted, keep = set(), [False] * len(cells)
        for i in reversed(range(max(i for i, k in enumerate(kinds) if k == "test") + 1)):
            source = "".join(cells[i]["source"])
            if kinds[i] == "markdown":
                keep[i] = i == 0 or re.search(r"\*\*Exercise \d\d[a-z]", source) is not None
            elif WRITEFILE_CELL.match(source) or kinds[i] == "solution":  # a script: its names are not the notebook's
                keep[i] = True
            elif kinds[i] == "test":
                keep[i] = True
                wanted |= _free_names(source)
            else:
                trimmed, wanted = _trim(source, wanted)
                if trimmed is not None:
                    keep[i] = True
                    cells[i]["source"] = trimmed.splitlines(keepends=True)
    stem = Path(path).stem
    out = []
    for i, (cell, kind) in enumerate(zip(cells, kinds, strict=True)):
        if not keep[i]:
            continue
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            source = "".join(cell["source"])
            ids = [e for e, _ in exercises(source)] if kind == "solution" else CHECK_CALL.findall(source)
            grade_id = {"solution": f"{'-'.join(ids)}-solution", "test": f"{'-'.join(ids)}-check"}.get(
                kind, f"{stem[:2]}-cell-{i}")
            meta = {"grade": kind == "test", "grade_id": grade_id, "locked": kind != "solution",
                    "schema_version": 3, "solution": kind == "solution", "task": False}
            if kind == "test":
                meta["points"] = len(ids)
            cell["metadata"]["nbgrader"] = meta
        out.append(cell)
    nb["cells"] = out
    return nb


WRITEFILE_CELL = re.compile(r"^%%writefile\s")


def write_nbgrader(out: Path, notebooks: Path = NOTEBOOKS, lessons: list[str] | None = None,
                   checks_only: bool = False) -> list[Path]:
    """Write an nbgrader course directory into ``out``: ``nbgrader_config.py`` and ``source/<lesson>/<lesson>.ipynb``
    for every lesson with exercises (or those whose number is in ``lessons``); return the notebooks written."""
    out = Path(out).resolve()
    written = []
    for path in sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb")):
        if lessons and path.name[:2] not in lessons:
            continue
        nb = nbgrader_notebook(path, checks_only)
        if nb is None:
            continue
        folder = out / "source" / path.stem
        folder.mkdir(parents=True, exist_ok=True)
        written.append(folder / path.name)
        written[-1].write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    (out / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(root=str(out)))
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the learner's version of each lesson: "
                                                 "every exercise's solution replaced by a NotImplementedError.")
    parser.add_argument("--out", type=Path, default=Path("build/exercises"), help="folder to write them into")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="folder of the NN_*.ipynb lessons")
    parser.add_argument("--nbgrader", type=Path, metavar="DIR",
                        help="write an nbgrader course directory into DIR (source/<lesson>/, nbgrader_config.py)")
    parser.add_argument("--lessons", nargs="+", metavar="NN", help="with --nbgrader: only these lessons (e.g. 01 09)")
    parser.add_argument("--checks-only", action="store_true",
                        help="with --nbgrader: only the cells the checks need (autograding in seconds, not minutes)")
    args = parser.parse_args(argv)
    if not args.notebooks.is_dir():
        parser.error(f"no folder {args.notebooks}")
    if args.nbgrader:
        written = write_nbgrader(args.nbgrader, args.notebooks, args.lessons, args.checks_only)
        for path in written:
            print(f"{path}: nbgrader source of {path.parent.name}")
        print(f"then, in {args.nbgrader}: nbgrader generate_assignment <lesson>, collect the submissions into "
              "submitted/<student>/<lesson>/, nbgrader autograde <lesson>")
        return 0 if written else 1
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
