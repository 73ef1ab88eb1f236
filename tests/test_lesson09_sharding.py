"""Lesson 09 (sharding the model): what the notebook does not check itself.

The notebook's check cells, run by nbmake in the quick profile, already assert every claim of its runs: each
layout's bytes per rank against ZeRO's formula, its collectives, the same steps as one process in float64,
the 2-D mesh, the DCP checkpoint saved by 2 ranks and loaded by 1, the split MLP block, and two refusals
started from the command line (exit code 2, nothing spawned). Running those scripts again here would add time,
not coverage. What is left: every script's flag checks, run in this process (no interpreter, no worker).
"""

import pytest
from conftest import refusal, write_scripts

NOTEBOOK = "09_sharding.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson09")
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
], ids=["unknown-mode", "single-on-two-ranks", "fsdp-tp-too-few-ranks", "batch-not-divisible", "too-few-steps",
        "tp-hidden-not-divisible", "tp-mlp-hidden", "dcp-batch", "no-checkpoint"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, script, flags, message):
    """The flag checks, run in this process: a refusal exits with 2 before launch() is reached."""
    assert message in refusal(scripts[script], *flags)
