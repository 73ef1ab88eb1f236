"""Lesson 02 (DistributedDataParallel): what the notebook's run does not cover.

The notebook's check cells assert the lesson's claims on its own runs of ddp_step, ddp_checkpoint, ddp_split,
ddp_mnist, ddp_proof (also under torchrun) and ddp_scaling; these tests add the scaling script's records for
both thread settings and the scripts' refusals of bad flags.
"""

import pytest
import torch
from conftest import refusal

from helpers.launch import run_script
from helpers.metrics import read_metrics

NOTEBOOK = "02_ddp.ipynb"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture
def scripts(lesson_scripts):
    return lesson_scripts(NOTEBOOK)


def run(scripts, name, *flags, **kwargs):
    return run_script(scripts[name], *flags, echo=False, timeout=kwargs.pop("timeout", 180), **kwargs)


def test_scaling_times_compute_allreduce_and_step_for_every_setting(scripts, tmp_path):
    run(scripts, "ddp_scaling.py", "--world-size", 2, "--threads", 1, 0, "--batch-sizes", 4, 32, "--steps", 2,
        "--rounds", 2, "--run-dir", tmp_path / "run")
    records = read_metrics(tmp_path / "run")
    assert [(r["threads_flag"], r["batch"]) for r in records] == [(1, 4), (1, 32), (0, 4), (0, 32)]
    for r in records:
        assert r["world_size"] == 2 and (r["threads"] == 1 if r["threads_flag"] == 1 else r["threads"] >= 1)
        assert 0 < r["allreduce"] and 0 < r["compute"] and 0 < r["seconds"]
        assert r["samples_per_s"] == pytest.approx(2 * r["batch"] / r["seconds"])


@pytest.mark.parametrize("script, flags, message", [
    ("ddp_step.py", ["--world-size", 0, "--run-dir", "x"], "--world-size: must be an integer >= 1"),
    ("ddp_checkpoint.py", ["--steps", 0, "--run-dir", "x"], "--steps: must be an integer >= 1"),
    pytest.param("ddp_split.py", ["--device", "cuda", "--run-dir", "x"], "no GPU is visible here",
                 marks=pytest.mark.skipif(GPUS > 0, reason="there is a GPU here")),
    ("ddp_mnist.py", ["--lr", -1], "--lr: must be a finite number"),
    ("ddp_mnist.py", ["--world-size", 3, "--batch-size", 64], "cannot be split evenly over --world-size 3"),
    ("ddp_mnist.py", ["--run-dir", "a-file/runs"], "argument --run-dir: cannot create folder 'a-file/runs'"),
    ("ddp_proof.py", ["--steps", 1000], "more than the"),
    ("ddp_scaling.py", ["--batch-sizes", 16, 0], "--batch-sizes: must be an integer >= 1"),
    ("checkpoint_killed.py", ["--writer", "zip", "--run-dir", "x"], "argument --writer: invalid choice: 'zip'"),
], ids=["step-world-size-0", "checkpoint-steps-0", "split-cuda-without-gpu", "mnist-lr-negative",
        "mnist-batch-not-divisible", "mnist-run-dir-not-creatable",
        "proof-steps-beyond-data", "scaling-batch-size-0", "killed-save-unknown-writer"])
def test_bad_flags_fail_in_one_line_before_any_worker_starts(scripts, script, flags, message, tmp_path):
    (tmp_path / "a-file").write_text("")  # no folder can be made inside a file, on any system, even as root
    assert message in refusal(scripts[script], *flags, cwd=tmp_path)
