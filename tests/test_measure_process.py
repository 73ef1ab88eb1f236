"""helpers.measure.process: CPU seconds and page faults, glibc's arenas, listening sockets, py-spy."""

import os
import platform
import socket
import subprocess
import sys
import time

import pytest
import torch

from helpers.measure import process
from helpers.measure.process import ListenerLog, own_listeners, py_spy_dumps

PY = sys.executable


@pytest.fixture
def not_linux(monkeypatch):
    """Pretend to be a Mac: what only Linux with glibc can measure must be skipped with one printed line."""
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    monkeypatch.setattr(process, "_SAID", set())


def test_usage_since_counts_this_process_cpu_seconds():
    before = process.process_usage()
    x = torch.randn(256, 256)
    for _ in range(200):
        x = torch.tanh(x @ x)
    spent, now = process.usage_since(before)
    assert spent["cpu_seconds"] > 0 and now["cpu_seconds"] >= before["cpu_seconds"] + spent["cpu_seconds"] - 1e-9
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert isinstance(spent["page_faults"], int) and spent["page_faults"] >= 0


def test_without_linux_and_glibc_page_faults_and_arenas_are_skipped_with_one_line(not_linux, monkeypatch, capsys):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert process.page_faults() is None and process.page_faults() is None
    assert process.usage_since(process.process_usage())[0]["page_faults"] is None
    process.set_malloc_arenas(1)
    assert "MALLOC_ARENA_MAX" not in os.environ
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["page faults: skipped, it needs Linux with glibc (this is darwin, C library unknown)",
                     "MALLOC_ARENA_MAX=1: skipped, it needs Linux with glibc (this is darwin, C library unknown)"]


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"),
                    reason="glibc on Linux only")
def test_malloc_arenas_reach_the_environment_of_new_processes(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    process.set_malloc_arenas(0)
    assert "MALLOC_ARENA_MAX" not in os.environ, "0 keeps the C library's default"
    process.set_malloc_arenas(2)
    assert os.environ["MALLOC_ARENA_MAX"] == "2"


def test_own_listeners_sees_a_listening_socket():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        found = own_listeners()
        if found is None:
            pytest.skip("this system does not list a process's sockets")
        assert ("127.0.0.1", s.getsockname()[1]) in found


def test_listener_log_finds_a_child_listening(capsys):
    child = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); " \
            "print(s.getsockname()[1], flush=True); time.sleep(3)"
    with ListenerLog() as log:
        proc = subprocess.Popen([PY, "-c", child], stdout=subprocess.PIPE, text=True)
        port = int(proc.stdout.readline())
        time.sleep(0.5)
        proc.kill()
        proc.wait()
    if not log.available:
        assert "needs root" in capsys.readouterr().out
        return
    assert log.found[proc.pid, port]["address"] == "127.0.0.1"


def test_listener_log_credits_a_socket_to_the_process_that_opened_it_not_to_a_child_that_inherited_it():
    # the window a torchrun agent's store is in while the agent starts a worker: forked, not yet exec'd
    parent = "import os, socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); " \
             "child = os.fork(); child and print(s.getsockname()[1], child, flush=True); time.sleep(2); " \
             "os._exit(0) if child == 0 else os.waitpid(child, 0)"  # the parent alone prints: no mixed line
    with ListenerLog() as log:
        proc = subprocess.Popen([PY, "-c", parent], stdout=subprocess.PIPE, text=True)
        port, child = map(int, proc.stdout.readline().split())
        time.sleep(0.6)
    os.kill(child, 9)
    proc.kill()
    proc.wait()
    if not log.available:
        pytest.skip("this system does not list other processes' sockets")
    assert sorted(pid for pid, p in log.found if p == port) == [proc.pid], (proc.pid, child, log.found)


def test_py_spy_dumps_a_live_process_or_says_in_one_line_why_not(capsys):
    proc = subprocess.Popen([PY, "-c", "import time\ndef waiting_here():\n    time.sleep(30)\nwaiting_here()"])
    try:
        time.sleep(1)
        stacks = py_spy_dumps({"child": proc.pid})
    finally:
        proc.kill()
        proc.wait()
    if stacks is None:
        lines = capsys.readouterr().out.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("py-spy dump skipped"), lines
    else:
        assert "waiting_here" in stacks["child"]
