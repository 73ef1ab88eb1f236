"""helpers.checkpoint: a process killed in the middle of a save leaves a checkpoint that loads."""

import os
import signal
import subprocess
import sys
import time

import torch

from helpers import warm
from helpers.checkpoint import save_atomically

# Saves versions 1, 2, 3 ... of a 16 MB checkpoint to one path, announcing each save before and after. Each
# announcement is one write: with unbuffered output print() writes its pieces one by one, and a kill between
# two of them would leave a line cut in half.
SAVER = """
import sys, torch
from helpers.checkpoint import save_atomically
path = sys.argv[1]
for version in range(1, 10_000):
    sys.stdout.write(f"saving {version}\\n"); sys.stdout.flush()
    save_atomically({"version": version, "weights": torch.full((4_000_000,), float(version))}, path)
    sys.stdout.write(f"saved {version}\\n"); sys.stdout.flush()
"""


def start_saver(tmp_path, path):
    """The saver as a script: forked from the warm starter where it can be (no torch import per trial)."""
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    return (warm.start([script, path], tmp_path, dict(os.environ))
            or subprocess.Popen([sys.executable, "-u", script, path], stdout=subprocess.PIPE, text=True))


def test_save_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_atomically({"step": 1}, path)
    save_atomically({"step": 2}, path)
    assert torch.load(path) == {"step": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_killed_in_the_middle_of_a_save_the_file_still_loads(tmp_path):
    path, mid_save = tmp_path / "ckpt.pt", 0
    for trial in range(6):
        saver = start_saver(tmp_path, path)
        lines = []
        while len(lines) < 2 * (trial + 2):  # let it get through a few saves, then kill it mid-way
            lines.append(saver.stdout.readline().split())
        time.sleep(0.002 * trial)
        os.kill(saver.pid, signal.SIGKILL)
        lines += [line.split() for line in saver.stdout.read().splitlines()]
        saver.wait()
        last_done = max(int(v) for what, v in lines if what == "saved")
        mid_save += lines[-1][0] == "saving"
        state = torch.load(path)  # would raise on a half-written file
        assert state["version"] in (last_done, last_done + 1), (state["version"], lines[-2:])
        assert torch.equal(state["weights"], torch.full((4_000_000,), float(state["version"])))
    assert mid_save >= 3, f"only {mid_save} of 6 kills landed during a save: the test proved little"
