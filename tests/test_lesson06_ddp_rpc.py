"""Lesson 06: DDP and RPC together (ddp_rpc.py) and its single-process baseline (single_process.py).

The notebook runs both scripts with both dense layers; these tests run them again on another seed and
check each claim of the lesson, plus bad input the notebook does not show.
"""

import importlib

import pytest
from conftest import refusal, write_scripts

from helpers.launch import pick_backend, run_script
from helpers.metrics import read_metrics

NOTEBOOK = "06_ddp_rpc.ipynb"
SMALL = ["--epochs", "8", "--steps", "8", "--batch-size", "64", "--seed", "1"]
BOUND = 0.1  # the notebook's bound on the cdopt layer's ‖WWᵀ − I‖


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson06")
    write_scripts(folder, NOTEBOOK)
    return folder


@pytest.fixture(scope="module")
def runs(scripts, tmp_path_factory):
    """``runs(script, dense)`` -> (per-epoch records, summary or None); each run made once per module."""
    done = {}

    def get(script, dense):
        if (script, dense) not in done:
            folder = tmp_path_factory.mktemp(f"{script[:-3]}_{dense}")
            run_script(scripts / script, *SMALL, "--dense", dense, "--run-dir", folder, echo=False, timeout=180)
            records = read_metrics(folder)
            done[script, dense] = ([r for r in records if "loss" in r],
                                   next((r for r in records if "dense_replica_diff" in r), None))
        return done[script, dense]

    return get


def test_master_drives_every_epoch_and_the_loss_falls(runs):
    epochs, _ = runs("ddp_rpc.py", "cdopt")
    assert [r["step"] for r in epochs] == list(range(1, 9))
    assert epochs[-1]["loss"] < 0.5 * epochs[0]["loss"], [r["loss"] for r in epochs]


def test_dense_replicas_are_identical_and_their_gradients_stay_in_the_context(runs):
    _, summary = runs("ddp_rpc.py", "cdopt")
    assert summary["dense_replica_diff"] == 0.0
    assert summary["grads_in_params"] == 0


def test_the_embedding_on_the_server_changes(runs):
    _, summary = runs("ddp_rpc.py", "cdopt")
    assert summary["embedding_change"] > 1e-3


def test_cdopt_layer_stays_feasible_and_the_plain_layer_does_not(runs):
    cdopt, _ = runs("ddp_rpc.py", "cdopt")
    plain, _ = runs("single_process.py", "linear")  # the same model in one process
    assert max(r["feasibility"] for r in cdopt) < BOUND
    assert plain[-1]["feasibility"] > BOUND


def test_single_process_baseline_learns_and_times_its_epochs(runs):
    epochs, summary = runs("single_process.py", "linear")
    assert summary is None and len(epochs) == 8
    assert epochs[-1]["loss"] < 0.5 * epochs[0]["loss"]
    assert all(r["seconds"] > 0 for r in epochs)


# the notebook shows --world-size 3, --dense orthogonal and --penalty 0 failing; these are the others
@pytest.mark.parametrize("script, flags, message", [
    ("ddp_rpc.py", ["--batch-size", "33"], "--batch-size 33 is odd"),
    ("single_process.py", ["--penalty", "-1"], "--penalty: must be a finite number > 0"),
], ids=["odd-batch", "negative-penalty"])
def test_bad_input_is_a_one_line_error_before_spawning(scripts, script, flags, message, tmp_path):
    assert message in refusal(scripts / script, *flags, cwd=tmp_path)


@pytest.mark.parametrize("gpus, backend, devices", [
    (0, "gloo", ["cpu", "cpu"]),
    (1, "gloo", ["cuda:0", "cuda:0"]),     # both trainers share the GPU; NCCL refuses that
    (2, "nccl", ["cuda:0", "cuda:1"]),
    (8, "nccl", ["cuda:0", "cuda:1"]),
])
def test_trainers_get_a_gpu_each_or_share_one(scripts, monkeypatch, gpus, backend, devices):
    monkeypatch.syspath_prepend(str(scripts))
    trainers = importlib.import_module("ddp_rpc").TRAINERS  # main() places this many ranks, the trainers
    placement = pick_backend("auto", trainers, "auto", gpus=gpus)
    assert placement.backend == backend
    assert [str(placement.device(i)) for i in range(trainers)] == devices
