"""Lesson 09 (scaling out, surviving faults): what the notebook cannot show safely, and the batch script.

The two-node equality, the kill-and-resume run and the collective mismatch run in the notebook itself (quick
profile), with their check cells; here: the kill in the middle of a save, the batch script, the bad flags.
"""

import os
import shlex
import subprocess

import psutil
import pytest
import torch
from conftest import refusal, run_in_this_process, write_scripts

from helpers.exercises import ExerciseFailed, check_script, replace_solution, stub
from helpers.runner import ScriptError, run_script

NOTEBOOK = "09_scaling_faults.ipynb"
TRAIN = ["--world-size", 2, "--steps", 20, "--checkpoint-every", 10, "--batch-size", 32, "--train-samples", 512,
         "--seed", 3, "--backend", "gloo", "--device", "cpu"]

# Runs a script; on its first attempt, rank 0 dies by SIGKILL half-way through writing its N-th checkpoint. What
# that save would have written goes, whole, to interrupted_save.pt next to it: the state the job had reached.
DIE_IN_SAVE = """
import io, os, runpy, signal, sys
import torch
nth, script = int(sys.argv[1]), sys.argv[2]
sys.argv = sys.argv[2:]
real_save, saves = torch.save, 0

def save(obj, f, *args, **kwargs):
    global saves
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if os.environ.get("RANK") == "0" and first_attempt and hasattr(f, "write"):
        saves += 1
        if saves == nth:
            whole = io.BytesIO()
            real_save(obj, whole, *args, **kwargs)
            with open(os.path.join(os.path.dirname(f.name), "interrupted_save.pt"), "wb") as reference:
                reference.write(whole.getvalue())
            f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)

torch.save = save
runpy.run_path(script, run_name="__main__")
"""


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """Lesson 09's scripts next to lesson 02's, which elastic_mnist.py imports its model from."""
    folder = tmp_path_factory.mktemp("lesson09")
    write_scripts(folder, "02_ddp.ipynb", NOTEBOOK)
    (folder / "die_in_save.py").write_text(DIE_IN_SAVE)
    return folder


def run(scripts, name, *flags, **kwargs):
    return run_script(scripts / name, *flags, echo=False, timeout=kwargs.pop("timeout", 180), **kwargs)


def leftovers(folder):
    """Processes still running one of this module's scripts (torchrun's workers included, wherever reparented)."""
    mine = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and any(str(folder) in part for part in p.info["cmdline"] or []):
            mine.append(p.info["cmdline"])
    return mine


def same(a, b):
    """Equal state: the same keys and structure, every tensor bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def test_killed_in_the_middle_of_a_save_the_job_resumes_from_the_previous_checkpoint(scripts, tmp_path):
    # two nodes, no restarts: rank 0 dies writing checkpoint 2 (step 20) and the whole job ends
    with pytest.raises(ScriptError):
        run(scripts, "nodes.py", "--nnodes", 2, "--nproc-per-node", 1, "--max-restarts", 0,
            scripts / "die_in_save.py", 2, scripts / "elastic_mnist.py", *TRAIN, "--run-dir", tmp_path)
    assert not leftovers(scripts), leftovers(scripts)  # nodes.py ended the other node, workers included
    (half_written,) = tmp_path.glob(".checkpoint.pt.*.tmp")  # the save really was cut short ...
    with pytest.raises(Exception):  # noqa: B017 (torch raises several types for a truncated file)
        torch.load(half_written)
    assert torch.load(tmp_path / "checkpoint.pt")["step"] == 10  # ... and the file on disk is the previous one
    interrupted = torch.load(tmp_path / "interrupted_save.pt")
    assert interrupted["step"] == 20

    out = run(scripts, "elastic_mnist.py", *TRAIN, "--run-dir", tmp_path).output  # the same command resumes
    assert "resumed after step 10" in out and "finished at step 20" in out
    # steps 11..20 done again reach exactly the state the killed save was writing: weights and Adam's moments
    assert same(torch.load(tmp_path / "checkpoint.pt"), interrupted), "it must end where an undisturbed run does"


def test_sbatch_script_is_bash_that_starts_torchrun_with_the_same_command_on_every_node(scripts, tmp_path):
    flags = ["--world-size", 8, "--epochs", 2, "--run-dir", "runs/x y"]
    run_in_this_process(scripts / "nodes.py", "--sbatch", tmp_path / "job.sbatch", "--nnodes", 4, "--nproc-per-node",
                        2, "--max-restarts", 3, "--time", "01:30:00", "ddp_mnist.py", *flags, cwd=scripts)
    job = tmp_path / "job.sbatch"
    assert subprocess.run(["bash", "-n", job]).returncode == 0
    assert "#SBATCH --nodes=4" in job.read_text() and "#SBATCH --time=01:30:00" in job.read_text()
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in job.read_text(), "restarted workers need a fresh store"
    for stand_in, body in {"srun": 'printf "%s\\n" "$@"', "scontrol": 'printf "n1\\nn2\\nn3\\nn4\\n"'}.items():
        (tmp_path / stand_in).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / stand_in).chmod(0o755)
    slurm = {"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_NNODES": "4", "SLURM_JOB_ID": "123",
             "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    argv = subprocess.run(["bash", job], env={**os.environ, **slurm}, capture_output=True, text=True,
                          check=True, timeout=30).stdout.splitlines()
    assert argv == ["torchrun", "--nnodes", "4", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", "n1:20123", "--rdzv-id", "123", "--max-restarts", "3", "ddp_mnist.py",
                    *map(str, flags)], shlex.join(argv)


@pytest.mark.parametrize("script, flags, message", [
    ("nodes.py", ["--max-restarts", "-1", "ddp_mnist.py"], "--max-restarts: must be an integer >= 0"),
    ("nodes.py", ["--rdzv-endpoint", "localhost", "ddp_mnist.py"], "expected host:port"),
    ("nodes.py", ["--rdzv-endpoint", "127.0.0.1:0", "ddp_mnist.py"], "expected host:port"),
    ("nodes.py", ["no_such_script.py"], "no script at no_such_script.py"),
    ("elastic_mnist.py", ["--steps", "50", "--kill-at-step", "51"], "--kill-at-step 51 is beyond the run's"),
    ("elastic_mnist.py", ["--world-size", "2", "--kill-at-step", "5", "--kill-rank", "2"],
     "--kill-rank 2 does not exist"),
    ("elastic_mnist.py", ["--world-size", "3", "--batch-size", "64"], "must be a multiple of --world-size 3"),
    ("desync.py", ["--timeout", "0"], "--timeout: must be a finite number <= 3600 and > 0, got 0"),
    ("desync.py", ["--timeout", "2", "--dump-after", "2"], "--dump-after 2 must be shorter than --timeout 2"),
    ("resumable.py", ["--check", "--kill-in-save", "7"], "--kill-in-save 7 must be a checkpoint step after the first"),
    ("checkpoint_killed.py", ["--writer", "zip", "--run-dir", "x"], "argument --writer: invalid choice: 'zip'"),
], ids=["negative-restarts", "endpoint-without-port", "endpoint-port-zero", "no-script", "kill-beyond-run",
        "kill-rank-missing", "batch-not-divisible", "zero-timeout", "dump-after-timeout",
        "kill-not-at-a-checkpoint", "killed-save-unknown-writer"])
def test_bad_flags_fail_in_one_line_before_anything_starts(scripts, script, flags, message):
    error = refusal(scripts / script, *flags, cwd=scripts)
    assert message in error, error
    assert not leftovers(scripts)


RESUME = ["--check", "--steps", 30, "--checkpoint-every", 5, "--kill-in-save", 20]


def check_resumable(scripts, tmp_path, source):
    """Exercise 09a's check on `source` in place of resumable.py (killed while saving step 20, resumed)."""
    path = tmp_path / "resumable.py"
    path.write_text(source)
    return check_script("09a", path, *RESUME, "--run-dir", tmp_path / "run", timeout=120, echo=False)


def test_exercise_09a_passes_the_solution_and_fails_the_stub_and_wrong_answers(scripts, tmp_path):
    source = (scripts / "resumable.py").read_text()
    assert "resumed from step 15" in check_resumable(scripts, tmp_path, source)
    with pytest.raises(ExerciseFailed, match="^Exercise 09a: not written yet"):
        check_resumable(scripts, tmp_path, stub(source))
    not_atomic = replace_solution(source, "09a", 'path.with_name(path.name + ".partial")', "path")
    with pytest.raises(ExerciseFailed, match=r"step_000020\.pt is broken .*: the save killed midway"):
        check_resumable(scripts, tmp_path, not_atomic)
    oldest = replace_solution(source, "09a", "paths[-1]", "paths[0]")
    with pytest.raises(ExerciseFailed, match="resumed from step 5, expected 15"):
        check_resumable(scripts, tmp_path, oldest)
