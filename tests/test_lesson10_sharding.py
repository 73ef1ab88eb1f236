"""Lesson 10 (ZeRO and FSDP2): what the notebook does not check itself.

The notebook's check cells, run by nbmake in the quick profile, already assert every claim of its runs: each
layout's bytes per rank against ZeRO's formula, its collectives, the same steps as one process in float64,
FSDP2's gathered weights with and without resharding, HSDP on a 2-D mesh, the DCP checkpoint saved by 2 ranks
and loaded by 1, ZeRO-2 (exercise 10a, whose check is shown failing here on its stub and on wrong answers),
and a refusal started from the command line (exit code 2, nothing spawned). Running those scripts again here
would add time, not coverage. What is left: every script's flag checks, run in this process (no interpreter, no
worker).
"""

import pytest
from conftest import check_source, refusal, write_scripts

from helpers.exercises import ExerciseFailed, replace_solution, stub

NOTEBOOK = "10_sharding.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson10")
    return write_scripts(folder, NOTEBOOK)


@pytest.mark.parametrize("script, flags, message", [
    ("shard_train.py", ["--modes", "zero4"], "invalid choice: 'zero4'"),
    ("shard_train.py", ["--modes", "single", "--world-size", 2], "mode single is one process"),
    ("shard_train.py", ["--modes", "fsdp_tp", "--world-size", 2], "mode fsdp_tp needs --world-size a multiple"),
    ("shard_train.py", ["--modes", "ddp", "--batch-size", 5], "--batch-size 5 must be a multiple of the 2"),
    ("shard_train.py", ["--steps", 3], "--steps: must be an integer >= 4 and <= 10000, got 3"),
    ("shard_train.py", ["--modes", "tp", "--world-size", 3], "tensor parallelism over 3 ranks needs 3 to divide"),
    ("shard_train.py", ["--modes", "hsdp", "--world-size", 3], "mode hsdp needs --world-size a multiple of 2"),
    ("fsdp_gathered.py", ["--batch-size", 5], "--batch-size 5 must be a multiple of --world-size 2"),
    ("dcp_save.py", ["--world-size", 2, "--batch-size", 3], "--batch-size 3 must be a multiple of --world-size 2"),
    ("dcp_load.py", ["--ckpt-dir", "no/such/folder"], "no checkpoint in no/such/folder"),
    ("zero2_train.py", ["--world-size", 2, "--batch-size", 5], "--batch-size 5 must be a multiple of --world-size 2"),
], ids=["unknown-mode", "single-on-two-ranks", "fsdp-tp-too-few-ranks", "batch-not-divisible", "too-few-steps",
        "tp-hidden-not-divisible", "hsdp-rows", "gathered-batch", "dcp-batch", "no-checkpoint", "zero2-batch"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, script, flags, message):
    """The flag checks, run in this process: a refusal exits with 2 before launch() is reached."""
    assert message in refusal(scripts[script], *flags)


ZERO2 = ["--world-size", 2, "--steps", 2, "--dim", 32, "--hidden", 64, "--blocks", 2, "--seq-len", 16]


def check_zero2(scripts, tmp_path, source):
    """Exercise 10a's check on `source` in place of zero2_train.py (2 ranks, 2 steps of a small model)."""
    path = scripts["zero2_train.py"].with_name("zero2_under_test.py")  # beside tinyformer.py
    return check_source("10a", path, source, *ZERO2, "--run-dir", tmp_path)


def test_exercise_10a_passes_the_solution_and_fails_the_stub_and_wrong_answers(scripts, tmp_path):
    source = scripts["zero2_train.py"].read_text()
    assert "steps equal one process" in check_zero2(scripts, tmp_path, source)
    with pytest.raises(ExerciseFailed, match="^Exercise 10a: not written yet"):
        check_zero2(scripts, tmp_path, stub(source))
    all_reduce = replace_solution(source, "10a", "dist.reduce_scatter_single(shard.grad, grads)",
                                  "dist.all_reduce(grads)\n    shard.grad.copy_(grads.chunk(world)[dist.get_rank()])")
    with pytest.raises(ExerciseFailed, match=r"rank \d's step ran \{'all-reduce': 1, 'all-gather': 1\}, expected one "
                                             "reduce-scatter and one all-gather"):
        check_zero2(scripts, tmp_path, all_reduce)
    no_gather = replace_solution(source, "10a", "dist.all_gather_single(flat, shard.detach().clone())", "pass")
    with pytest.raises(ExerciseFailed, match=r"rank \d parameter \d+ element \[.*\]: expected .*, got"):
        check_zero2(scripts, tmp_path, no_gather)
    full_grads = replace_solution(source, "10a", "p.grad = None", "p.grad.zero_()")  # zeroed, but kept whole
    with pytest.raises(ExerciseFailed, match=r"rank \d holds .* bytes between steps .* ZeRO-2 predicts"):
        check_zero2(scripts, tmp_path, full_grads)
