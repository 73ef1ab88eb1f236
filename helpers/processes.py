"""Watching the processes of a run from outside: start several launchers with prefixed output, list the TCP
sockets a run listens on, dump a live process's Python stacks.

Listing another process's sockets (``psutil.net_connections``) needs root on macOS, and ``py-spy dump``
needs the right to trace the process (root, or ``kernel.yama.ptrace_scope=0`` on Linux); where they are not
available these helpers print one line saying what is skipped and why, and return ``None``.
"""

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil


def run_prefixed(commands: list[list[str]], envs: list[dict], prefixes: list[str]) -> int:
    """Start every command at once, print each output line behind its prefix, and wait for them.

    Returns 0 when all exit with 0, else the first non-zero exit code, as soon as one command has failed:
    the others are then terminated. Launchers such as ``torchrun`` start their children in sessions of
    their own, out of reach of the parent's process group, so every descendant seen while the commands
    ran is killed at the end too: nothing outlives this call.
    """
    procs, relays, seen = [], [], set()
    try:
        for command, env, prefix in zip(commands, envs, prefixes, strict=True):
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
            relays.append(threading.Thread(target=_relay, args=(prefix, procs[-1].stdout), daemon=True))
            relays[-1].start()
        while True:
            codes = [proc.poll() for proc in procs]
            for proc, code in zip(procs, codes, strict=True):
                if code is None:
                    try:
                        seen.update(psutil.Process(proc.pid).children(recursive=True))
                    except psutil.NoSuchProcess:
                        pass
            failed = [code for code in codes if code]
            if failed or None not in codes:
                return failed[0] if failed else 0
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for child in seen:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for relay in relays:
            relay.join(timeout=5)


def _relay(prefix, stream):
    for line in stream:
        sys.stdout.write(f"{prefix} {line}")
        sys.stdout.flush()


ENVIRONMENT = ("RANK", "GROUP_RANK", "MASTER_PORT")  # what a torchrun worker's environment says about its place


class ListenerLog:
    """Records, every 0.1 s while in a ``with`` block, the listening TCP sockets of this process's children.

    ``found`` maps (pid, port) to ``{"address", "cmdline", "env", "parent"}``: the socket's address, the
    process's command line, its ``RANK``, ``GROUP_RANK`` and ``MASTER_PORT`` (``None`` where unset), and
    its parent's command line. Where the system will not list sockets (macOS without root), ``available``
    is False, ``found`` stays empty, and one line says so.
    """

    def __init__(self):
        self.found, self.stop, self.available = {}, threading.Event(), True
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
            children = {p.pid: p for p in psutil.Process().children(recursive=True)}
            for c in psutil.net_connections("tcp"):
                if c.status == psutil.CONN_LISTEN and c.pid in children and (c.pid, c.laddr.port) not in self.found:
                    try:
                        p = children[c.pid]
                        env = {k: p.environ().get(k) for k in ENVIRONMENT}
                        self.found[c.pid, c.laddr.port] = {"address": c.laddr.ip, "cmdline": p.cmdline(), "env": env,
                                                           "parent": p.parent().cmdline()}
                    except psutil.Error:  # it ended in between
                        pass
            self.stop.wait(0.1)


def own_listeners() -> list[tuple[str, int]] | None:
    """(address, port) of every TCP socket this process listens on, sorted; ``None`` where not allowed."""
    try:
        return sorted((c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp")
                      if c.status == psutil.CONN_LISTEN)
    except psutil.AccessDenied:
        return None


def py_spy_dumps(pids: dict) -> dict | None:
    """``{key: text}``: ``py-spy dump`` of each process in ``{key: pid}``, its colour codes removed.

    Returns ``None``, after printing one line why, where py-spy is not installed or may not attach (it
    needs the right to trace another process: root or sudo, or ``kernel.yama.ptrace_scope=0`` on Linux).
    """
    exe = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if exe is None:
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
