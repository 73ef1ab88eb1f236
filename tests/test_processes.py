"""helpers.processes: prefixed launchers that end together, the listener sampler, own listeners, py-spy."""

import socket
import subprocess
import sys
import time

import pytest

from helpers.launch import running_children
from helpers.processes import ListenerLog, own_listeners, py_spy_dumps, run_prefixed

PY = sys.executable


def test_run_prefixed_prefixes_every_line_and_returns_zero(capfd):
    code = run_prefixed([[PY, "-c", "print('hello')"], [PY, "-c", "print('world')"]], [None, None], ["[a]", "[b]"])
    out = capfd.readouterr().out
    assert code == 0 and "[a] hello" in out and "[b] world" in out


def test_run_prefixed_ends_the_others_when_one_fails_and_leaves_no_process():
    sleeper = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], " \
              "start_new_session=True); time.sleep(60)"
    start = time.monotonic()
    code = run_prefixed([[PY, "-c", "import sys, time; time.sleep(1); sys.exit(3)"], [PY, "-c", sleeper]],
                        [None, None], ["[a]", "[b]"])
    assert code == 3 and time.monotonic() - start < 20
    time.sleep(0.5)
    survivors = running_children()
    assert not survivors, survivors


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
