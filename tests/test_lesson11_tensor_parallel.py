"""Lesson 11 (tensor and sequence parallelism): what the notebook does not check itself.

The notebook's check cells, run by nbmake in the quick profile, assert every claim of its runs: the split MLP
block, TP's bytes, collectives and proof, SP's collectives, the bytes autograd saves under TP, TP + SP, Megatron's
re-gather and checkpointing against `mlp_saved_bytes` on 2 and 4 ranks, Adam's sums of the Partial norm
gradients, the tiling mistake, `loss_parallel` and FSDP2 x TP. What is left: every script's flag checks, run in
this process; exercise 11a's check failing on its stub and on wrong answers; and the old claim that SP keeps 1/n
of TP's activations failing against a real run.
"""

import json

import pytest
from conftest import check_source, refusal, write_scripts

from helpers.exercises import ExerciseFailed, replace_solution, stub
from helpers.runner import run_script

NOTEBOOK = "11_tensor_parallel.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson11")
    return write_scripts(folder, "10_sharding.ipynb", NOTEBOOK)  # tp_mlp.py reads lesson 10's model


@pytest.mark.parametrize("script, flags, message", [
    ("tp_mlp.py", ["--world-size", 3], "--world-size 3 does not divide --hidden 512"),
    ("tp_sp.py", ["--world-size", 3], "--world-size 3 does not divide --hidden 256"),
    ("tp_sp.py", ["--seq-len", 33], "--world-size 2 does not divide --seq-len 33"),
    ("sp_memory.py", ["--seq-len", 33], "--world-size 2 does not divide --seq-len 33"),
    ("loss_parallel.py", ["--vocab", 1001], "--world-size 2 does not divide --vocab 1001"),
], ids=["tp-mlp-hidden", "sp-hidden", "sp-sequence", "sp-memory-sequence", "loss-parallel-vocab"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, script, flags, message):
    """The flag checks, run in this process: a refusal exits with 2 before launch() is reached."""
    assert message in refusal(scripts[script], *flags)


def test_sp_bytes_refuses_an_unknown_layout(scripts, monkeypatch):
    monkeypatch.syspath_prepend(str(scripts["sp_bytes.py"].parent))
    from sp_bytes import mlp_saved_bytes

    with pytest.raises(ValueError, match="layout is one of"):
        mlp_saved_bytes(4, 32, 64, 256, 2, "megatron")


def test_sequence_parallel_saves_the_gathered_input_whole_not_one_nth_of_tp(scripts, tmp_path, monkeypatch):
    """The notebook's check of SP's saved bytes, on a real 2-rank run: it holds for PyTorch's formula and fails
    on the old claim (TP + SP keeps 1/n of what TP keeps)."""
    monkeypatch.syspath_prepend(str(scripts["sp_bytes.py"].parent))
    from sp_bytes import mlp_saved_bytes

    shape = (2, 8, 16, 32)  # batch, sequence, width, hidden
    run_script(scripts["sp_memory.py"], "--world-size", 2, "--batch-size", 2, "--seq-len", 8, "--dim", 16,
               "--hidden", 32, "--device", "cpu", "--run-dir", tmp_path, timeout=180, echo=False)
    ranks = json.loads((tmp_path / "rank0.jsonl").read_text().splitlines()[0])["ranks"]
    for rank in ranks:
        for layout in ("tp", "tp_sp", "tp_sp_megatron", "tp_sp_ckpt"):
            assert rank[layout]["saved"] == sum(mlp_saved_bytes(*shape, 2, layout, elem=8).values()), layout
        old_claim = rank["tp"]["saved"] / 2  # "the activation held between the two regions is 1/n"
        assert rank["tp_sp"]["saved"] != old_claim and rank["tp_sp_megatron"]["saved"] != old_claim


def check_sp(scripts, tmp_path, source):
    """Exercise 11a's check on `source` in place of tp_sp.py (2 ranks, a small block)."""
    path = scripts["tp_sp.py"].with_name("tp_sp_under_test.py")
    return check_source("11a", path, source, "--world-size", 2, "--dim", 16, "--hidden", 32, "--seq-len", 8,
                        "--run-dir", tmp_path)


def test_exercise_11a_passes_the_solution_and_fails_the_stub_and_wrong_answers(scripts, tmp_path):
    source = scripts["tp_sp.py"].read_text()
    assert "equal the unsplit block" in check_sp(scripts, tmp_path, source)
    with pytest.raises(ExerciseFailed, match="^Exercise 11a: not written yet"):
        check_sp(scripts, tmp_path, stub(source))
    # the tiling mistake: every rank hands the block the whole sequence, which SequenceParallel reads as a slice
    tiling = replace_solution(source, "11a", "return x.chunk(mesh.size(), dim=1)[mesh.get_local_rank()]", "return x")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 11a: tiling: the norm's sequence is 16 tokens long on "
                                             r"rank \d, not 8"):
        check_sp(scripts, tmp_path, tiling)
    # the norm left replicated: each rank's norm gradient comes from its own tokens only, and nothing sums it
    no_norm = replace_solution(source, "11a", '"norm": SequenceParallel(),', "")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 11a: rank \d norm.weight element \[\d+\]: expected"):
        check_sp(scripts, tmp_path, no_norm)
    # TP's plan on slices of the sequence: up reads each rank's different slice as the same replicated input
    tp_only = replace_solution(source, "11a", new="""
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        return x.chunk(mesh.size(), dim=1)[mesh.get_local_rank()]""")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 11a: rank \d output element"):
        check_sp(scripts, tmp_path, tp_only)
