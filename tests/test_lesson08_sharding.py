"""Lesson 08 (sharding the model): the notebook's scripts, run for real with small settings."""

import time

import pytest
import torch
from conftest import run_in_this_process, write_scripts

from helpers.compare import max_diff
from helpers.launch import ScriptError, run_script
from helpers.metrics import read_metrics

NOTEBOOK = "08_sharding.ipynb"
STEPS = 4


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson08")
    return write_scripts(folder, NOTEBOOK)


def run(scripts, name, *flags, timeout=180):
    return run_script(scripts[name], *flags, echo=False, timeout=timeout)




@pytest.fixture(scope="module")
def proof(scripts, tmp_path_factory):
    """DDP, FSDP2 and TP on 2 ranks in float64: ({mode: summary}, {mode: weights}).

    That they also equal one process is the notebook's check; DDP equals one process is lesson 01's proof.
    """
    folder = tmp_path_factory.mktemp("proof")
    run(scripts, "shard_train.py", "--modes", "ddp", "fsdp", "tp", "--world-size", 2, "--steps", STEPS,
        "--dtypes", "float64", "--device", "cpu", "--run-dir", folder)
    summaries = {r["mode"]: r for r in read_metrics(folder) if "per_rank" in r}
    return summaries, {m: torch.load(folder / f"weights_{m}_float64.pt") for m in summaries}


def flat(w, key="after"):
    return [w[key][name] for name in sorted(w[key])]


def test_fsdp_and_tp_take_the_same_steps_as_ddp(proof):
    _, weights = proof
    reference = flat(weights["ddp"])
    assert max_diff(reference, flat(weights["ddp"], "before")) > 1e-3  # the steps did move the weights
    assert max_diff(flat(weights["fsdp"], "before"), flat(weights["tp"], "before")) == 0  # one start for all
    for mode in ("fsdp", "tp"):
        assert max_diff(flat(weights[mode]), reference) < 1e-9, mode


def test_fsdp_holds_a_zero3_share_and_ddp_a_full_replica(proof):
    summaries, _ = proof
    psi, elem = summaries["ddp"]["psi"], summaries["ddp"]["element_size"]
    full = 4 * elem * psi  # parameters, gradients, Adam's two moments
    for rank in summaries["fsdp"]["per_rank"]:
        assert abs(sum(rank.values()) / (full / 2) - 1) < 0.10, rank
    for rank in summaries["ddp"]["per_rank"]:
        assert abs(sum(rank.values()) / full - 1) < 0.01, rank
    split = summaries["tp"]["psi_split"]
    for rank in summaries["tp"]["per_rank"]:
        assert abs(sum(rank.values()) / (4 * elem * (psi - split / 2)) - 1) < 0.01, rank


def test_each_layout_runs_its_own_collectives(proof):
    summaries, _ = proof
    blocks = summaries["ddp"]["blocks"]
    assert summaries["ddp"]["collectives"] == {"all-reduce": summaries["ddp"]["ddp_buckets"]}
    assert summaries["fsdp"]["collectives"] == {"all-gather": 2 * (blocks + 1) - 1, "reduce-scatter": blocks + 1}
    assert summaries["tp"]["collectives"] == {"all-reduce": 6 * blocks}


def test_checkpoint_saved_by_two_ranks_loads_into_one_process(scripts, tmp_path):
    ckpt = tmp_path / "checkpoints"
    run(scripts, "dcp_save.py", "--world-size", 2, "--steps", 2, "--ckpt-dir", ckpt, "--run-dir", tmp_path,
        "--device", "cpu")
    run_in_this_process(scripts["dcp_load.py"], "--ckpt-dir", ckpt, "--run-dir", tmp_path, "--device", "cpu",
                        spawn=True)
    saver, loader = (next(r for r in read_metrics(tmp_path) if r.get("role") == role) for role in ("saver", "loader"))
    assert torch.load(ckpt / "latest.pt")["folder"] == "step_000002"
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest.pt", "step_000002"]  # no .partial folder left
    assert sorted(p.name for p in (ckpt / "step_000002").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert abs(loader["eval_loss_before_load"] - saver["eval_loss"]) > 0.1
    assert abs(loader["eval_loss"] - saver["eval_loss"]) < 1e-6
    assert abs(loader["eval_loss_after_next_step"] - saver["eval_loss_after_next_step"]) < 1e-5


def test_tensor_parallel_mlp_equals_the_unsplit_block(scripts, tmp_path):
    run(scripts, "tp_mlp.py", "--world-size", 2, "--run-dir", tmp_path, "--device", "cpu")
    ranks = read_metrics(tmp_path)[0]["ranks"]
    assert len(ranks) == 2
    for record in ranks:
        assert record["output_diff"] < 1e-5 and max(record["grad_diffs"].values()) < 1e-5, record
        assert record["shapes"]["up.weight"] == [256, 128] and record["shapes"]["down.weight"] == [128, 256]
        assert record["where"]["MLP.down"] == {"forward": {"all-reduce": 1}}
        assert record["where"]["MLP.up"] == {"backward": {"all-reduce": 1}}


def test_tp_world_size_not_dividing_hidden_fails_in_one_line_before_any_worker_starts(scripts):
    start = time.perf_counter()
    with pytest.raises(ScriptError) as failure:
        run(scripts, "shard_train.py", "--modes", "tp", "--world-size", 3, timeout=60)
    first_line = str(failure.value).splitlines()[0]
    assert "exit code 2" in first_line and "tensor parallelism over 3 ranks needs 3 to divide" in first_line
    assert "[rank" not in str(failure.value) and "Traceback" not in str(failure.value)
    assert time.perf_counter() - start < 45


@pytest.mark.parametrize("script, flags, message", [
    ("shard_train.py", ["--modes", "zero4"], "invalid choice: 'zero4'"),
    ("shard_train.py", ["--modes", "single", "--world-size", 2], "mode single is one process"),
    ("shard_train.py", ["--modes", "fsdp_tp", "--world-size", 2], "mode fsdp_tp needs --world-size a multiple"),
    ("shard_train.py", ["--modes", "ddp", "--batch-size", 5], "--batch-size 5 must be a multiple of the 2"),
    ("shard_train.py", ["--steps", 3], "--steps: must be an integer >= 4 and <= 10000, got 3"),
    ("tp_mlp.py", ["--world-size", 3], "--world-size 3 does not divide --hidden 512"),
    ("dcp_save.py", ["--world-size", 2, "--batch-size", 3], "--batch-size 3 must be a multiple of --world-size 2"),
    ("dcp_load.py", ["--ckpt-dir", "no/such/folder"], "no checkpoint in no/such/folder"),
], ids=["unknown-mode", "single-on-two-ranks", "fsdp-tp-too-few-ranks", "batch-not-divisible", "too-few-steps",
        "tp-mlp-hidden", "dcp-batch", "no-checkpoint"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, capsys, script, flags, message):
    """The flag checks, run in this process: a refusal exits with 2 before launch() is reached."""
    with pytest.raises(SystemExit) as refused:
        run_in_this_process(scripts[script], *flags)
    assert refused.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
