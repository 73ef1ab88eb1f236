"""helpers.runner.run_script: a script in its own process group, streamed, limited and cleaned up."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers.runner import ScriptTimeout, run_script, running_children

SCRIPT = Path(__file__).parent / "scripts" / "collective.py"


def worker_pids(out: Path, n: int, wait: float = 120) -> list[int]:
    """Pids the workers recorded, once all ``n`` have (they record after rendezvous)."""
    deadline = time.monotonic() + wait
    while len(list(out.glob("rank*.json"))) < n:
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.2)
    time.sleep(0.5)  # let the last writer finish its file
    return [json.loads(p.read_text())["pid"] for p in sorted(out.glob("rank*.json"))]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_output_is_streamed_and_returned(tmp_path, capsys):
    run = run_script(SCRIPT, "--world-size", 2, "--out", tmp_path, timeout=120)
    printed = capsys.readouterr().out
    assert "[rank 0] sum 1" in printed and "[rank 1] sum 1" in printed
    assert "[rank 0] sum 1" in run.output and run.seconds > 0
    assert "output" not in repr(run), "the repr stays short in a notebook"


def test_missing_script_is_refused_before_spawning(tmp_path):
    with pytest.raises(FileNotFoundError, match="no script at .*nope.py: run the cell that writes it first"):
        run_script(tmp_path / "nope.py")
    assert not running_children()


def test_timeout_kills_every_process_of_the_run(tmp_path):
    start = time.perf_counter()
    with pytest.raises(ScriptTimeout, match="did not finish within 12 s"):
        run_script(SCRIPT, "--world-size", 2, "--hang", "--out", tmp_path, echo=False, timeout=12)
    assert time.perf_counter() - start < 27
    pids = worker_pids(tmp_path, 2, wait=1)
    assert not [p for p in pids if alive(p)], "a worker outlived the timeout"
    rendezvous = Path(json.loads((tmp_path / "rank0.json").read_text())["init_method"].removeprefix("file://"))
    assert rendezvous.parent.name.startswith("course-rendezvous-") and not rendezvous.parent.exists(), \
        f"the killed launcher left {rendezvous.parent} behind"


def test_interrupt_kills_every_process_of_the_run(tmp_path):
    driver = (f"from helpers.runner import run_script\n"
              f"run_script({str(SCRIPT)!r}, '--world-size', '2', '--hang', '--out', {str(tmp_path)!r})\n")
    # A kernel handles SIGINT. A shell without job control starts background jobs with SIGINT ignored, which
    # children inherit and Python then honours: give the driver the default handling, as a kernel has.
    notebook = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pids = worker_pids(tmp_path, 2)
    notebook.send_signal(signal.SIGINT)  # what the notebook's "interrupt kernel" sends
    try:  # run_script needs at most ~8 s to end the group; the rest is room for a loaded machine
        _, err = notebook.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        notebook.kill()
        notebook.communicate()
        raise
    assert "KeyboardInterrupt" in err
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "a worker outlived the interrupt"


def test_environment_reaches_the_script(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os; print(os.environ['COURSE_PROBE'], os.environ['PYTHONUNBUFFERED'])\n")
    assert run_script(probe, env={"COURSE_PROBE": "seen"}, echo=False).output.split() == ["seen", "1"]


@pytest.mark.parametrize("timeout", [0, -1])
def test_timeout_must_be_positive(tmp_path, timeout):
    probe = tmp_path / "probe.py"
    probe.write_text("raise SystemExit('must not run')\n")
    with pytest.raises(ValueError, match="timeout must be > 0"):
        run_script(probe, timeout=timeout)


def test_exit_code_and_last_line_head_the_error(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nprint('working')\nsys.exit('bad thing happened')\n")
    from helpers.runner import ScriptError

    with pytest.raises(ScriptError) as failed:
        run_script(probe, echo=False)
    assert str(failed.value) == "probe.py failed with exit code 1: bad thing happened"
    assert failed.value.output == "working\nbad thing happened\n", "all it printed, stderr too, travels with it"
    assert os.path.exists(probe)
