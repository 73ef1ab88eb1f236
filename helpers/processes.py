"""Starting several launchers at once, each line of their output behind its prefix (lesson 09's two nodes).

What a run's processes spend and open (listening sockets, stack dumps) is measured in
:mod:`helpers.measure.process`.
"""

import subprocess
import sys
import threading
import time

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
