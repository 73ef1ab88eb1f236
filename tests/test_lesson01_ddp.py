"""Lesson 01 (DistributedDataParallel): the notebook's scripts, run for real with small settings."""

import sys
import time

import pytest
import torch

from helpers.launch import ScriptError, run_script
from helpers.metrics import read_metrics

NOTEBOOK = "01_ddp.ipynb"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


@pytest.fixture
def scripts(lesson_scripts):
    return lesson_scripts(NOTEBOOK)


def run(scripts, name, *flags, **kwargs):
    return run_script(scripts[name], *flags, echo=False, timeout=kwargs.pop("timeout", 180), **kwargs)


def per_rank(folder, part, world_size=2):
    return [torch.load(folder / f"{part}_rank{r}.pt") for r in range(world_size)]


def test_ddp_step_averages_gradients_and_leaves_identical_parameters(scripts, tmp_path):
    run(scripts, "ddp_basics.py", "--part", "step", "--world-size", 2, "--run-dir", tmp_path)
    r0, r1 = per_rank(tmp_path, "step")
    assert torch.equal(r0["synced_init"], r0["own_init"]) and torch.equal(r1["synced_init"], r0["own_init"])
    assert torch.allclose(r0["ddp_grad"], (r0["local_grad"] + r1["local_grad"]) / 2, atol=1e-6)
    assert torch.equal(r0["after_step"], r1["after_step"])


def test_checkpoint_is_saved_atomically_and_loaded_by_every_rank(scripts, tmp_path):
    run(scripts, "ddp_basics.py", "--part", "checkpoint", "--world-size", 2, "--run-dir", tmp_path)
    assert (tmp_path / "checkpoint.pt").is_file() and not list(tmp_path.glob("*.tmp"))
    for rank in per_rank(tmp_path, "checkpoint"):
        assert not torch.allclose(rank["before_load"], rank["saved"])
        assert torch.equal(rank["after_load"], rank["saved"])


def test_model_split_over_two_devices_trains_under_ddp_without_device_ids(scripts, tmp_path):
    run(scripts, "ddp_basics.py", "--part", "split", "--world-size", 2, "--steps", 3, "--run-dir", tmp_path)
    r0, r1 = per_rank(tmp_path, "split")
    assert r0["device_ids"] is None and r1["device_ids"] is None
    assert torch.equal(r0["weights"], r1["weights"])
    assert r0["losses"][-1] < r0["losses"][0] and r1["losses"][-1] < r1["losses"][0]


def test_mnist_training_loss_falls_in_a_few_steps(scripts, tmp_path):
    run(scripts, "ddp_mnist.py", "--world-size", 2, "--epochs", 1, "--max-steps", 20, "--run-dir", tmp_path)
    records = read_metrics(tmp_path)
    for rank in (0, 1):
        losses = [r["loss"] for r in records if r["rank"] == rank and "loss" in r]
        assert losses[-1] < losses[0], f"rank {rank}: {losses}"
    (epoch,) = [r for r in records if "accuracy" in r]
    assert epoch["step"] == 20 and epoch["samples_per_s"] > 0 and epoch["accuracy"] > 0.2


def test_ddp_matches_single_process(scripts, tmp_path):
    run(scripts, "ddp_proof.py", "--world-size", 2, "--batch-size", 64, "--steps", 10, "--dtype", "float64",
        "--run-dir", tmp_path)
    (result,) = read_metrics(tmp_path)
    assert result["max_diff"] < 1e-10, result
    assert result["max_diff_rank0_only"] > 1e-3 and result["max_change"] > 1e-3, result


def test_training_script_runs_under_torchrun(scripts, tmp_path):
    out = run(scripts, "ddp_mnist.py", "--world-size", 2, "--max-steps", 10, "--run-dir", tmp_path,
              command=TORCHRUN).output
    records = read_metrics(tmp_path)
    assert {r["rank"] for r in records if "loss" in r} == {0, 1}
    (epoch,) = [r for r in records if "accuracy" in r]
    assert epoch["step"] == 10 and epoch["threads"] == 1, epoch
    assert "[rank 0] epoch 1 step 10" in out


@pytest.mark.parametrize("script, flags, message", [
    ("ddp_mnist.py", ["--world-size", 100_000], "is larger than the"),
    ("ddp_mnist.py", ["--model", "resnet9000"], "invalid choice: 'resnet9000'"),
    ("ddp_mnist.py", ["--batch-size", 0], "--batch-size: must be at least 1, got 0"),
    ("ddp_proof.py", ["--world-size", 3, "--batch-size", 64], "must be a multiple of --world-size 3"),
    ("ddp_proof.py", ["--steps", 1000], "more than the"),
    ("ddp_basics.py", ["--part", "everything"], "invalid choice: 'everything'"),
    pytest.param("ddp_mnist.py", ["--backend", "nccl"], "needs one GPU per rank",
                 marks=pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="NCCL can run here")),
], ids=["world-size-above-samples", "unknown-model", "batch-size-0", "batch-not-divisible",
        "steps-beyond-data", "unknown-part", "nccl-without-gpus"])
def test_bad_flags_fail_in_one_line_before_any_worker_starts(scripts, script, flags, message):
    start = time.perf_counter()
    with pytest.raises(ScriptError) as failure:
        run(scripts, script, *flags, timeout=60)
    first_line = str(failure.value).splitlines()[0]
    assert "exit code 2" in first_line and message in first_line, str(failure.value)
    assert "[rank" not in str(failure.value) and "Traceback" not in str(failure.value)
    assert time.perf_counter() - start < 45
