"""What a process spends and opens: CPU seconds and page faults, glibc's malloc arenas, the TCP sockets a run
listens on, a live process's Python stacks.

    before = process_usage()             # {"cpu_seconds": ..., "page_faults": ... or None}
    spent, now = usage_since(before)

Page faults and glibc's malloc arenas exist only on Linux with glibc; listing another process's sockets
(``psutil.net_connections``) needs root on macOS; ``py-spy dump`` needs the right to trace the process (root,
or ``kernel.yama.ptrace_scope=0`` on Linux). Where they are not available these functions print one line
saying what is skipped and why, and return ``None`` or do nothing, instead of failing.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from helpers.runner import running_children

_SAID = set()  # what this process has already said it skips: one line each


def linux_glibc(what: str) -> bool:
    """True on Linux with glibc; elsewhere print once "``what``: skipped, ..." and return False."""
    libc = platform.libc_ver()[0]
    if sys.platform.startswith("linux") and libc == "glibc":
        return True
    if what not in _SAID:
        _SAID.add(what)
        print(f"{what}: skipped, it needs Linux with glibc (this is {sys.platform}, C library "
              f"{libc or 'unknown'})", flush=True)
    return False


def page_faults() -> int | None:
    """Minor page faults of this process so far (Linux with glibc), else None after one printed line."""
    if not linux_glibc("page faults"):
        return None
    import resource  # not on Windows

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def process_usage() -> dict:
    """This process's CPU seconds (all its threads) and page faults so far: ``{"cpu_seconds", "page_faults"}``."""
    return {"cpu_seconds": time.process_time(), "page_faults": page_faults()}


def usage_since(before: dict) -> tuple[dict, dict]:
    """``(what this process spent since before, now)``, both shaped as :func:`process_usage`; None stays None."""
    now = process_usage()
    spent = {key: None if now[key] is None or before[key] is None else now[key] - before[key] for key in now}
    return spent, now


def set_malloc_arenas(arenas: int) -> None:
    """Make processes started from here use at most ``arenas`` glibc malloc arenas (0: glibc's default).

    Sets ``MALLOC_ARENA_MAX``, which each new process's C library reads as it starts; on a system
    without glibc it prints one line and does nothing.
    """
    if arenas and linux_glibc(f"MALLOC_ARENA_MAX={arenas}"):
        os.environ["MALLOC_ARENA_MAX"] = str(arenas)


ENVIRONMENT = ("RANK", "GROUP_RANK", "MASTER_PORT")  # what a torchrun worker's environment says about its place


class ListenerLog:
    """Records, every 0.1 s while in a ``with`` block, the listening TCP sockets of this process's children
    (:func:`helpers.runner.running_children`: with the scripts a warm starter forked for it).

    ``found`` maps (pid, port) to ``{"address", "cmdline", "env", "parent"}``: the socket's address, the
    process's command line, its ``RANK``, ``GROUP_RANK`` and ``MASTER_PORT`` (``None`` where unset), and
    its parent's command line. A socket that a process and one of its ancestors both hold is the ancestor's:
    the child inherited it (between fork and exec, say) and did not open it. Where the system will not list
    sockets (macOS without root), ``available`` is False, ``found`` stays empty, and one line says so.
    """

    def __init__(self):
        self.found, self.stop, self.available = {}, threading.Event(), True
        self._openers = {}  # (holder's pid, address, port) -> the opener's pid, looked up once per socket
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self):
        try:
            psutil.net_connections("tcp")
        except psutil.AccessDenied:
            self.available = False
            print("listening sockets not listed: psutil.net_connections needs root on this system (macOS)")
        else:
            self.thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        if self.available:
            self.thread.join()

    def _sample(self):
        while not self.stop.is_set():
            children = {p.pid: p for p in running_children()}  # a lent warm starter's scripts too
            for c in psutil.net_connections("tcp"):  # each socket under one of the processes that hold it
                if c.status != psutil.CONN_LISTEN or c.pid not in children:
                    continue
                key = (c.pid, c.laddr.ip, c.laddr.port)
                if key not in self._openers:
                    self._openers[key] = _opener(children[c.pid], (c.laddr.ip, c.laddr.port))
                pid = self._openers[key]
                if pid in children and (pid, c.laddr.port) not in self.found:
                    try:
                        p = children[pid]
                        env = {k: p.environ().get(k) for k in ENVIRONMENT}
                        self.found[pid, c.laddr.port] = {"address": c.laddr.ip, "cmdline": p.cmdline(), "env": env,
                                                         "parent": p.parent().cmdline()}
                    except psutil.Error:  # it ended in between
                        pass
            self.stop.wait(0.1)


def _opener(process: psutil.Process, address: tuple) -> int | None:
    """The pid of the oldest ancestor of ``process`` (or itself) that listens on ``address`` too: a child holds
    its parent's sockets between fork and exec (a torchrun agent's store, in a worker it is starting), and
    ``psutil.net_connections`` names only one holder of a socket, perhaps the child. None: it ended meanwhile."""
    try:
        for parent in reversed(process.parents()):
            try:
                if address in _listening(parent):
                    return parent.pid
            except psutil.Error:
                continue
        return process.pid
    except psutil.Error:
        return None


def _listening(process: psutil.Process) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``process`` listens on, sorted (psutil's errors pass through)."""
    return sorted((c.laddr.ip, c.laddr.port) for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN)


def own_listeners() -> list[tuple[str, int]] | None:
    """(address, port) of every TCP socket this process listens on, sorted; ``None`` where not allowed."""
    try:
        return _listening(psutil.Process())
    except psutil.AccessDenied:
        return None


PY_SPY_ENV = "COURSE_PY_SPY"  # the py-spy to run (a wrapper that adds sudo, say); set empty, none is used


def py_spy_dumps(pids: dict) -> dict | None:
    """``{key: text}``: ``py-spy dump`` of each process in ``{key: pid}``, its colour codes removed. The py-spy
    run is ``COURSE_PY_SPY`` when set (empty: none, as where it is not installed), else the one on the PATH or
    beside this Python.

    Returns ``None``, after printing one line why, where py-spy is not installed or may not attach (it
    needs the right to trace another process: root or sudo, or ``kernel.yama.ptrace_scope=0`` on Linux).
    """
    exe = os.environ.get(PY_SPY_ENV)
    if exe is None:
        exe = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if not exe:
        print("py-spy dump skipped: py-spy is not installed (pip install py-spy)")
        return None
    stacks = {}
    for key, pid in pids.items():
        result = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        stacks[key] = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
        if result.returncode or "Thread" not in stacks[key]:
            reason = (stacks[key].strip().splitlines() or ["no output"])[-1]
            print(f"py-spy dump skipped: it may not trace processes here ({reason}); run with sudo, or on Linux "
                  f"set kernel.yama.ptrace_scope=0")
            return None
    return stacks
