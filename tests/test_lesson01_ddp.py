"""Lesson 01 (DistributedDataParallel): the notebook's scripts, run for real with small settings."""

import sys

import pytest
import torch
from conftest import refusal

from helpers.launch import pick_backend, run_script
from helpers.metrics import read_metrics

NOTEBOOK = "01_ddp.ipynb"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture
def scripts(lesson_scripts):
    return lesson_scripts(NOTEBOOK)


def run(scripts, name, *flags, **kwargs):
    return run_script(scripts[name], *flags, echo=False, timeout=kwargs.pop("timeout", 180), **kwargs)


def per_rank(folder, part, world_size=2):
    return [torch.load(folder / f"{part}_rank{r}.pt") for r in range(world_size)]


def test_ddp_step_averages_gradients_and_leaves_identical_parameters(scripts, tmp_path):
    out = run(scripts, "ddp_step.py", "--world-size", 2, "--run-dir", tmp_path).output
    r0, r1 = per_rank(tmp_path, "step")
    assert not torch.equal(r0["own_init"], r1["own_init"])
    assert torch.equal(r0["synced_init"], r0["own_init"]) and torch.equal(r1["synced_init"], r0["own_init"])
    assert torch.allclose(r0["ddp_grad"], (r0["local_grad"] + r1["local_grad"]) / 2, atol=1e-6)
    assert torch.equal(r0["after_step"], r1["after_step"])
    assert f"[rank 0] path: {pick_backend('auto', 2)}" in out


def test_checkpoint_restores_weights_and_momentum_on_each_device_and_resumes_exactly(scripts, tmp_path):
    run(scripts, "ddp_checkpoint.py", "--world-size", 2, "--run-dir", tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint.pt", "checkpoint_rank0.pt",
                                                                    "checkpoint_rank1.pt"]
    for rank in per_rank(tmp_path / "run", "checkpoint"):
        assert not torch.allclose(rank["before_load"], rank["saved"])
        assert torch.equal(rank["after_load"], rank["saved"])
        assert rank["loaded_on"] == [rank["device"]]
        assert torch.equal(rank["loaded_momentum"], rank["saved_momentum"]) and rank["saved_momentum"].norm() > 0
        assert torch.equal(rank["resumed"], rank["continued"])
        assert not torch.allclose(rank["weights_only"], rank["continued"])


def test_split_model_trains_under_ddp_which_refuses_device_ids_for_it(scripts, tmp_path):
    world = 1 if 2 <= GPUS < 4 else 2
    run(scripts, "ddp_split.py", "--world-size", world, "--steps", 3, "--run-dir", tmp_path)
    ranks = per_rank(tmp_path, "split", world)
    for r in ranks:
        assert r["losses"][-1] < r["losses"][0]
        if GPUS >= 2 * world:
            assert r["devices"]["hidden.weight"] != r["devices"]["out.weight"], r["devices"]
        if GPUS >= 2 * world or GPUS == 0:
            assert "device_ids" in r["refused"], r["refused"]
    assert all(torch.equal(r["weights"], ranks[0]["weights"]) for r in ranks)


def test_ddp_matches_single_process(scripts, tmp_path):
    run(scripts, "ddp_proof.py", "--world-size", 2, "--batch-size", 64, "--steps", 10, "--dtype", "float64",
        "--run-dir", tmp_path)
    (result,) = read_metrics(tmp_path)
    assert result["max_diff"] < 1e-10, result
    assert result["max_diff_rank0_only"] > 1e-3 and result["max_change"] > 1e-3, result


def test_training_script_runs_under_torchrun_and_its_loss_falls(scripts, tmp_path):
    out = run(scripts, "ddp_mnist.py", "--world-size", 2, "--max-steps", 20, "--run-dir", tmp_path / "run",
              command=TORCHRUN).output
    records = read_metrics(tmp_path / "run")
    for rank in (0, 1):
        losses = [r["loss"] for r in records if r["rank"] == rank and "loss" in r]
        assert len(losses) >= 2 and losses[-1] < losses[0], f"rank {rank}: {losses}"
    (epoch,) = [r for r in records if "accuracy" in r]
    assert epoch["step"] == 20 and epoch["threads"] == 1 and epoch["samples_per_s"] > 0, epoch
    assert epoch["accuracy"] > 0.2 and epoch["parameters"] == 46_730, epoch
    assert "[rank 0] epoch 1 step 20" in out and f"[rank 0] path: {pick_backend('auto', 2)}" in out


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
    ("ddp_mnist.py", ["--run-dir", "/proc/no/such/folder"],
     "argument --run-dir: cannot create folder '/proc/no/such/folder'"),
    ("ddp_proof.py", ["--steps", 1000], "more than the"),
    ("ddp_scaling.py", ["--batch-sizes", 16, 0], "--batch-sizes: must be an integer >= 1"),
], ids=["step-world-size-0", "checkpoint-steps-0", "split-cuda-without-gpu", "mnist-lr-negative",
        "mnist-batch-not-divisible", "mnist-run-dir-not-creatable",
        "proof-steps-beyond-data", "scaling-batch-size-0"])
def test_bad_flags_fail_in_one_line_before_any_worker_starts(scripts, script, flags, message, tmp_path):
    assert message in refusal(scripts[script], *flags, cwd=tmp_path)
