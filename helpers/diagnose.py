"""Why a run did not finish: where each rank waited (its traceback, or a ``py-spy dump`` of a rank still
waiting, cut to the learner's files), the deadlock, crash and died lines with the usual cause, and the threads
of an in-notebook check that never ended. The launcher (:func:`helpers.launch.launch`) and the exercises'
checks (:mod:`helpers.exercises.checks`) use it."""

from __future__ import annotations

import linecache
import re
import sys
import time
from pathlib import Path

from helpers.exercises.format import TITLE, exercise_seconds, not_written

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
                  rpc: bool = False, unread: dict | None = None) -> str:
    """The one-line verdict of a run whose ranks stopped waiting at the timeout: where each rank waited (from
    ``stacks``, ``{rank: traceback or py-spy dump}``) and one hint of the usual cause. ``unread`` is
    ``{rank: why}`` for the ranks whose stack could not be read (py-spy missing, or not allowed to attach): the
    line names them and why, and says which ranks the hint comes from."""
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
    why_not: dict[str, list[int]] = {}
    for rank, why in sorted((unread or {}).items()):
        why_not.setdefault(why, []).append(rank)
    parts += [f"{_ranks(ranks)}: not read ({why})" for why, ranks in why_not.items()]
    after = f" after {seconds:g} s" if seconds else ""
    known = [p for p in places.values() if p]
    if rpc:
        what, hint = (f"an RPC did not return{after}",
                      "the remote function waits for something that never happens (a lock it already holds, a "
                      "reply from the rank that is waiting for it) or never ends")
    else:
        what, hint = f"deadlock, no rank went on{after}", _deadlock_hint(known)
    read, unread_ranks = [rank for rank, place in places.items() if place], sorted(unread or {})
    source = ""  # a hint from some ranks' stacks holds only if the others wait as they do: it says so
    if unread_ranks and read:
        source = (f", if {_ranks(unread_ranks)} {'waits' if len(unread_ranks) == 1 else 'wait'} as {_ranks(read)} "
                  f"{'does' if len(read) == 1 else 'do'}")
    return f"Exercise {exercise}: {what}: {'; '.join(parts) or 'no stack of any rank'}. Hint{source}: {hint}"


def crash_line(exercise: str, rank: int, text: str, folder: Path | None = None) -> str:
    """The one-line verdict of rank ``rank`` raising: the last line of its error, and the learner's line."""
    failed = re.findall(r"ExerciseFailed: (Exercise " + re.escape(exercise) + r": .*)", text)
    if failed:
        return failed[-1]
    if not_written(exercise, text):
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
        return deadlock_line(exercise, report["stacks"], exercise_seconds(), folder, rpc=rpc,
                             unread=report.get("unread"))
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
        report["unread"] = {}  # {rank: why its stack could not be read}: said in the verdict, never dropped
        for index, process in enumerate(context.processes):
            if process.is_alive():
                said = io.StringIO()
                with contextlib.redirect_stdout(said):  # py-spy's one line of why not goes into the verdict
                    dump = py_spy_dumps({index: process.pid})
                if dump:
                    report["stacks"][index] = dump[index]
                    continue
                alive = process.is_alive()  # it may have ended while py-spy tried: then its traceback, if any
                texts[index] = None if alive else traceback_of(index)
                if not texts[index]:
                    why = said.getvalue().strip().splitlines()
                    report["unread"][index] = (why[-1].removeprefix("py-spy dump skipped: ") if alive and why
                                               else "it ended before its stack could be read")
                    continue
            if texts.get(index):
                report["stacks"][index] = texts[index]
    return report


def threads_line(exercise: str, threads: list, seconds: float) -> str:
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
