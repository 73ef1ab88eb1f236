"""Lesson 10 (sharding the model): what the notebook does not check itself.

The notebook's check cells, run by nbmake in the quick profile, already assert every claim of its runs: each
layout's bytes per rank against ZeRO's formula, its collectives, the same steps as one process in float64,
the 2-D mesh, the DCP checkpoint saved by 2 ranks and loaded by 1, ZeRO-2 (exercise 10a, whose check is shown
failing here on its stub and on wrong answers), the split MLP block, and two refusals
started from the command line (exit code 2, nothing spawned). Running those scripts again here would add time,
not coverage. What is left: every script's flag checks, run in this process (no interpreter, no worker).
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
    ("tp_mlp.py", ["--world-size", 3], "--world-size 3 does not divide --hidden 512"),
    ("dcp_save.py", ["--world-size", 2, "--batch-size", 3], "--batch-size 3 must be a multiple of --world-size 2"),
    ("dcp_load.py", ["--ckpt-dir", "no/such/folder"], "no checkpoint in no/such/folder"),
    ("zero2_train.py", ["--world-size", 2, "--batch-size", 5], "--batch-size 5 must be a multiple of --world-size 2"),
    ("tp_sp.py", ["--world-size", 3], "--world-size 3 does not divide --hidden 256"),
    ("tp_sp.py", ["--seq-len", 33], "--world-size 2 does not divide --seq-len 33"),
    ("loss_parallel.py", ["--vocab", 1001], "--world-size 2 does not divide --vocab 1001"),
], ids=["unknown-mode", "single-on-two-ranks", "fsdp-tp-too-few-ranks", "batch-not-divisible", "too-few-steps",
        "tp-hidden-not-divisible", "tp-mlp-hidden", "dcp-batch", "no-checkpoint", "zero2-batch", "sp-hidden",
        "sp-sequence", "loss-parallel-vocab"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, script, flags, message):
    """The flag checks, run in this process: a refusal exits with 2 before launch() is reached."""
    assert message in refusal(scripts[script], *flags)


ZERO2 = ["--world-size", 2, "--steps", 2, "--dim", 32, "--hidden", 64, "--blocks", 2, "--seq-len", 16]


def check_zero2(scripts, tmp_path, source):
    """Exercise 10a's check on `source` in place of zero2_train.py (2 ranks, 2 steps of a small model)."""
    path = scripts["zero2_train.py"].with_name("zero2_under_test.py")  # beside tinyformer.py
    return check_source("10a", path, source, *ZERO2, "--run-dir", tmp_path)


def test_exercise_09a_passes_the_solution_and_fails_the_stub_and_wrong_answers(scripts, tmp_path):
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


def check_sp(scripts, tmp_path, source):
    """Exercise 10b's check on `source` in place of tp_sp.py (2 ranks, a small block)."""
    path = scripts["tp_sp.py"].with_name("tp_sp_under_test.py")
    return check_source("10b", path, source, "--world-size", 2, "--dim", 16, "--hidden", 32, "--seq-len", 8,
                        "--run-dir", tmp_path)


def test_exercise_09b_passes_the_solution_and_fails_the_stub_and_wrong_answers(scripts, tmp_path):
    source = scripts["tp_sp.py"].read_text()
    assert "equal the unsplit block" in check_sp(scripts, tmp_path, source)
    with pytest.raises(ExerciseFailed, match="^Exercise 10b: not written yet"):
        check_sp(scripts, tmp_path, stub(source))
    # the tiling mistake: every rank hands the block the whole sequence, which SequenceParallel reads as a slice
    tiling = replace_solution(source, "10b", "return x.chunk(mesh.size(), dim=1)[mesh.get_local_rank()]", "return x")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 10b: tiling: the norm's sequence is 16 tokens long on "
                                             r"rank \d, not 8"):
        check_sp(scripts, tmp_path, tiling)
    # the norm left replicated: each rank's norm gradient comes from its own tokens only, and nothing sums it
    no_norm = replace_solution(source, "10b", '"norm": SequenceParallel(),', "")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 10b: rank \d norm.weight element \[\d+\]: expected"):
        check_sp(scripts, tmp_path, no_norm)
    # TP's plan on slices of the sequence: up reads each rank's different slice as the same replicated input
    tp_only = replace_solution(source, "10b", new="""
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        return x.chunk(mesh.size(), dim=1)[mesh.get_local_rank()]""")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 10b: rank \d output element"):
        check_sp(scripts, tmp_path, tp_only)
