"""Lesson 08: DDP and RPC together (ddp_rpc.py) and its single-process baseline (ddp_rpc_single_process.py).

The notebook runs both scripts with both dense layers and its check cell asserts each claim of the lesson on
those runs (every epoch logged, the loss halved, identical replicas that moved, nothing left in .grad, the
table changed, the same start as the baseline, a bit-identical repeat, the cdopt layer feasible and the plain
one not); a second launch of the same runs here would check nothing more. These tests cover what the
notebook does not: bad input it does not show, where the trainers are placed on machines with 0, 1, 2 or
8 GPUs, a run with --async-updates, and exercise 08a's check failing on its stub and on two wrong forwards.
"""

import importlib

import pytest
from conftest import refusal, write_scripts

from helpers.exercises import ExerciseFailed, check_script, replace_solution, stub
from helpers.launch import pick_backend
from helpers.metrics import read_metrics
from helpers.runner import run_script

NOTEBOOK = "08_ddp_rpc.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson08")
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


SMALL = ["--epochs", 2, "--steps", 2, "--batch-size", 8, "--num-ids", 40, "--dim", 8]


def test_async_updates_run_to_the_end_with_identical_dense_replicas(scripts, tmp_path):
    # the flag drops only the turns of the table's updates: DDP still keeps the two dense replicas equal
    run = run_script(scripts / "ddp_rpc.py", *SMALL, "--async-updates", "--run-dir", tmp_path, cwd=tmp_path,
                     echo=False, timeout=120)
    assert "[rank 0] path: " in run.output
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    summary = next(r for r in records if "dense_replica_diff" in r)
    assert summary["dense_replica_diff"] == 0.0 and summary["embedding_change"] > 0, summary


FORWARD = ["--batch-size", 8, "--num-ids", 40, "--dim", 8]


def check_08a(scripts, source):
    (scripts / "ddp_rpc_forward.py").write_text(source)
    return check_script("08a", scripts / "ddp_rpc_forward.py", *FORWARD, timeout=120, echo=False)


@pytest.fixture
def forward_source(scripts):
    source = (scripts / "ddp_rpc_forward.py").read_text()
    yield source
    (scripts / "ddp_rpc_forward.py").write_text(source)


def test_exercise_08a_check_fails_on_the_stub(scripts, forward_source):
    with pytest.raises(ExerciseFailed, match="^Exercise 08a: not written yet"):
        check_08a(scripts, stub(forward_source))


def test_exercise_08a_check_fails_when_the_forward_skips_ddp(scripts, forward_source):
    # the module inside the DDP wrapper computes the same logits, but nothing all-reduces its gradients
    wrong = replace_solution(forward_source, "08a", "logits = dense(vectors", "logits = dense.module(vectors")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 08a: trainer\d dense weight gradient \(the whole batch's, "
                                             r"averaged by DDP\) element \[\d+, \d+\]: expected .*, got "):
        check_08a(scripts, wrong)


def test_exercise_08a_check_fails_on_a_summed_loss(scripts, forward_source):
    wrong = replace_solution(forward_source, "08a", "labels.to(device))", "labels.to(device), reduction=\"sum\")")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 08a: trainer\d loss of its half element \[\]: expected "):
        check_08a(scripts, wrong)
