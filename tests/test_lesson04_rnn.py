"""Lesson 04: the character LSTM split over RPC (rnn_train.py, rnn_proof.py), run for real with small settings.

The notebook's check cells assert the proof's claims (distributed step = local step, no accumulation across
contexts, the warning hidden) on its own run of rnn_proof.py; these tests train on three seeds (determinism),
under torchrun, show exercise 04a's check failing on its stub and on a wrong answer, and try the scripts'
refusals of bad flags.
"""

import sys

import pytest
import torch
from conftest import refusal, write_scripts

from helpers.exercises import ExerciseFailed, check_script, replace_solution, stub
from helpers.launch import pick_backend
from helpers.metrics import read_metrics
from helpers.rpc import FUNCTIONAL_OPTIMIZER_DEPRECATION
from helpers.runner import run_script

NOTEBOOK = "04_rnn_dist_autograd.ipynb"
SMALL = ["--hidden", 32, "--emb-dim", 16, "--batch-size", 8, "--seq-len", 30]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson04")
    write_scripts(folder, NOTEBOOK)
    return folder


@pytest.fixture(scope="module")
def train(scripts, tmp_path_factory):
    """``train(seed, again=False)`` -> (records, output) of a 20-step run; each run made once per module."""
    done = {}

    def get(seed, again=False):
        if (seed, again) not in done:
            folder = tmp_path_factory.mktemp(f"train_seed{seed}")
            output = run_script(scripts / "rnn_train.py", *SMALL, "--steps", 20, "--eval-every", 10,
                                "--sample-chars", 40, "--seed", seed, "--run-dir", folder,
                                echo=False, timeout=120).output
            done[seed, again] = read_metrics(folder), output
        return done[seed, again]

    return get


def test_validation_loss_falls_and_samples_are_printed(train):
    records, output = train(0)
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(val) == 3 and val[-1] < val[0] - 0.3, val
    assert len([r for r in records if "loss" in r]) == 20
    (summary,) = [r for r in records if "sample_after" in r]
    for sample in (summary["sample_before"], summary["sample_after"]):
        assert sample.startswith("Elizabeth") and len(sample) == len("Elizabeth") + 40
        assert sample in output
    assert summary["sample_before"] != summary["sample_after"]


def test_same_seed_gives_same_numbers_and_another_seed_does_not(train):
    def numbers(records):
        return [(r.get("loss"), r.get("val_loss"), r.get("sample_after")) for r in records]

    assert numbers(train(0)[0]) == numbers(train(0, again=True)[0])
    assert numbers(train(0)[0]) != numbers(train(1)[0])


def test_optimizer_warning_is_printed_once_per_parameter_owner(train):
    assert train(0)[1].count(FUNCTIONAL_OPTIMIZER_DEPRECATION) == 2


def test_lstm_on_the_trainers_device_and_only_cpu_tensors_cross_rpc(train):
    (summary,) = [r for r in train(0)[0] if "lstm_device" in r]
    assert summary["lstm_device"] == str(pick_backend("auto", 2).device(0))
    assert summary["ps_devices"] == {"params": ["cpu"], "cuda_initialised": False}
    assert summary["crossing_device"] == "cpu"
    assert "path: the trainer's LSTM on" in train(0)[1]


def test_training_script_runs_under_torchrun(scripts, tmp_path):
    output = run_script(scripts / "rnn_train.py", "--world-size", 2, *SMALL, "--steps", 3, "--eval-every", 3,
                        "--sample-chars", 5, "--run-dir", tmp_path, command=TORCHRUN, echo=False,
                        timeout=120).output
    assert [r["step"] for r in read_metrics(tmp_path) if "val_loss" in r] == [0, 3]
    assert "path: the trainer's LSTM on" in output


@pytest.mark.parametrize("script, flags, message", [
    ("rnn_train.py", ["--world-size", "1"], "--world-size 1: this model has two roles"),
    ("rnn_proof.py", ["--world-size", "3"], "--world-size 3: this model has two roles"),
    ("rnn_train.py", ["--seq-len", "1"], "argument --seq-len: must be an integer >= 2, got 1"),
    ("rnn_train.py", ["--text", "no-such-book.txt"], "--text no-such-book.txt: no such file"),
    ("rnn_proof.py", ["--text", "{short}"], "too few for one window of --seq-len 100"),
    ("rnn_train.py", ["--val-fraction", "1"], "argument --val-fraction: must be a finite number > 0 and < 1"),
    ("rnn_train.py", ["--prompt", "Élise"], "all from the text (['É'] are not)"),
    ("rnn_train.py", ["--device", "cuda"], "device 'cuda' asked for, but no GPU is visible here"),
], ids=["one-worker", "three-workers", "seq-len-1", "missing-text", "short-text", "val-fraction-1",
        "prompt-outside-text", "cuda-without-gpu"])
def test_bad_input_is_a_one_line_error_before_spawning(scripts, tmp_path, script, flags, message):
    if "--device" in flags and torch.cuda.is_available():
        pytest.skip("a GPU is visible: --device cuda is valid here")
    short = tmp_path / "short.txt"
    short.write_text("It is a truth universally acknowledged.\n" * 3)
    flags = [f.format(short=short) for f in flags]
    assert message in refusal(scripts / script, *flags, cwd=tmp_path)


def test_exercise_04a_check_fails_on_the_stub_and_on_a_step_that_never_steps(scripts):
    path = scripts / "rnn_step_exercise.py"
    source = path.read_text()
    flags = [*SMALL, "--steps", 2]
    assert check_script("04a", path, *flags, timeout=120, echo=False).startswith("Exercise 04a: after each of 2")
    try:
        path.write_text(stub(source))
        with pytest.raises(ExerciseFailed, match="^Exercise 04a: not written yet"):
            check_script("04a", path, *flags, timeout=120, echo=False)
        path.write_text(replace_solution(source, "04a", "        optimizer.step(context_id)\n", ""))
        with pytest.raises(ExerciseFailed, match=r"^Exercise 04a: after step 1: embedding\.embedding\.weight "
                                                 r"element \[\d+, \d+\]: expected -?[\d.e-]+, got -?[\d.e-]+"):
            check_script("04a", path, *flags, timeout=120, echo=False)
    finally:
        path.write_text(source)  # the folder is shared by this module's tests
