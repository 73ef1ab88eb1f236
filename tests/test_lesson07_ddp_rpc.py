"""Lesson 07: DDP and RPC together (ddp_rpc.py) and its single-process baseline (ddp_rpc_single_process.py).

The notebook runs both scripts with both dense layers and its check cell asserts each claim of the lesson on
those runs (every epoch logged, the loss halved, identical replicas that moved, nothing left in .grad, the
table changed, the same start as the baseline, a bit-identical repeat, the cdopt layer feasible and the plain
one not); a second launch of the same runs here would check nothing more. These tests cover what the
notebook does not: bad input it does not show, and where the trainers are placed on machines with 0, 1, 2 or
8 GPUs.
"""

import importlib

import pytest
from conftest import refusal, write_scripts

from helpers.launch import pick_backend

NOTEBOOK = "07_ddp_rpc.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson07")
    write_scripts(folder, NOTEBOOK)
    return folder


# every refusal, in this process; the notebook's quick run starts only the first of its own as a script
@pytest.mark.parametrize("script, flags, message", [
    ("ddp_rpc.py", ["--world-size", "3"], "--world-size 3: this script has 4 roles"),
    ("ddp_rpc.py", ["--dense", "orthogonal"], "argument --dense: invalid choice: 'orthogonal'"),
    ("ddp_rpc.py", ["--penalty", "0"], "argument --penalty: must be a finite number > 0, got 0"),
    ("ddp_rpc.py", ["--batch-size", "33"], "--batch-size 33 is odd"),
    ("ddp_rpc_single_process.py", ["--penalty", "-1"], "--penalty: must be a finite number > 0"),
], ids=["world-size-3", "unknown-dense", "zero-penalty", "odd-batch", "negative-penalty"])
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
