"""helpers.processes: prefixed launchers that end together and leave no process behind."""

import sys
import time

from helpers.processes import run_prefixed
from helpers.runner import running_children

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
