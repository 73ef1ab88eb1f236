"""Run a script from a notebook: in its own process group, its output streamed live into the cell, within a time
limit; on failure, timeout or interrupt the whole group ends (no worker outlives the run) and the error shows
the failing rank's traceback. On Linux without a GPU the script is forked from :mod:`helpers.warm`'s starter,
which has imported torch already."""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from helpers import warm


class ScriptError(RuntimeError):
    """A script started by :func:`run_script` failed; the message holds its traceback, ``output`` all it printed."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


class ScriptTimeout(ScriptError):
    """A script started by :func:`run_script` ran past its time limit and was killed."""


@dataclasses.dataclass
class ScriptRun:
    """What :func:`run_script` returns: the script's whole output, its wall time in seconds, and whether it was
    forked from :mod:`helpers.warm`'s starter (``warm``) rather than started as a fresh interpreter."""

    output: str = dataclasses.field(repr=False)
    seconds: float
    warm: bool = False


def run_script(script, *args, timeout: float = 600, env: dict | None = None,
               cwd=None, echo: bool = True, command: list | None = None) -> ScriptRun:
    """Run ``python script *args`` in its own process group and stream its output live.

    Where :func:`helpers.warm.usable` (Linux, no GPU present), the script's process is forked from a warm
    starter that imported torch once, instead of a fresh interpreter importing it again; it behaves the same.
    ``command`` replaces the interpreter (e.g. ``["torchrun", "--nproc-per-node", "2"]``; never warm).
    On a non-zero exit, a timeout (``timeout`` seconds) or an interrupt the whole
    group (the script and every worker it started) is killed and
    :class:`ScriptError` / :class:`ScriptTimeout` / ``KeyboardInterrupt`` is
    raised; the error's first line says what failed, then comes the failing
    rank's traceback. No process of the group outlives this call.
    """
    path = Path(cwd or ".", script)
    if not path.is_file():
        raise FileNotFoundError(f"no script at {path}: run the cell that writes it first")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    argv = [*(command or [sys.executable, "-u"]), str(script), *map(str, args)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    start = time.perf_counter()
    proc = None if command else warm.start(argv[2:], cwd, full_env)  # forked from a process with torch imported
    warm_started = proc is not None
    if proc is None:
        proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, text=True, bufsize=1, errors="replace")
    lines: list[str] = []
    pipe: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, pipe), daemon=True).start()
    try:
        while True:
            left = timeout - (time.perf_counter() - start)
            if left <= 0:
                raise ScriptTimeout(f"{path.name} did not finish within {timeout:g} s and was killed:\n"
                                    + "".join(lines[-20:]), "".join(lines))
            try:
                line = pipe.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                break
            lines.append(line)
            if echo:
                print(line, end="", flush=True)
        code = proc.wait()
    finally:
        kill_group(proc)
    output = "".join(lines)
    if code != 0:
        raise ScriptError(_failure_message(path.name, code, output), output)
    return ScriptRun(output, time.perf_counter() - start, warm_started)


def running_children() -> list[psutil.Process]:
    """Processes this one started (and theirs) that still run, leaving out :mod:`helpers.warm`'s starters,
    which live as long as this process by design. The scripts a starter forked for this process count, also
    those of a starter lent by an ancestor (:func:`helpers.warm.share`), which are not its children."""
    servers = warm.server_pids()
    found = []
    for pid in warm.lent_scripts():
        try:
            script = psutil.Process(pid)
            found += [script, *script.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    for p in psutil.Process().children(recursive=True):
        found.append(p)
    alive = []
    for p in found:
        try:
            if p.pid not in servers and p.status() != psutil.STATUS_ZOMBIE and p not in alive:
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    return alive


def _pump(stream, pipe: queue.Queue) -> None:
    for line in stream:
        pipe.put(line)
    pipe.put(None)


def kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """End every process in ``proc``'s process group: SIGTERM, then SIGKILL after ``grace`` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _group_alive(proc):
            time.sleep(0.05)
        if not _group_alive(proc):
            break
    proc.wait()


def _group_alive(proc: subprocess.Popen) -> bool:
    """True while a process of the group still runs (zombies waiting to be reaped do not count)."""
    proc.poll()
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == proc.pid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):  # gone since listed, or not ours to ask about (macOS may say EPERM)
            continue
    return False


def _failure_message(name: str, code: int, output: str) -> str:
    out = output.rstrip().splitlines()
    last = out[-1].strip() if out else "(no output)"
    head = f"{name} failed with exit code {code}: {last}"
    for marker in ("raised:", "Traceback (most recent call last):"):
        starts = [i for i, line in enumerate(out) if line.rstrip().endswith(marker)]
        if starts:
            start = starts[-1]
            if "died with exit code" in last:  # no traceback of its own: its last words come before ours
                start = max(0, start - 15)
            return head + "\n" + "\n".join(out[start:][-75:])
    return head
