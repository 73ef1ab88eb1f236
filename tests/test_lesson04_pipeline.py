"""Lesson 04 (pipeline parallelism): the notebook's scripts, run for real on tiny images."""

import importlib
import sys

import pytest
from conftest import run_in_this_process, write_scripts

from helpers.launch import pick_backend, run_script
from helpers.metrics import read_metrics

NOTEBOOK = "04_pipeline.ipynb"
SIZES = ["--image-size", 32, "--batch-size", 8, "--seed", 3]
TIMING = ["--micro-batches", 1, 2, "--batches", 1, "--warmup", 1]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson04")
    return write_scripts(folder, NOTEBOOK)


@pytest.fixture(scope="module")
def run(scripts, tmp_path_factory):
    """``run(script, *flags)`` -> the records it wrote; each distinct run is made once per module."""
    done = {}

    def get(name, *flags):
        key = (name, *map(str, flags))
        if key not in done:
            folder = tmp_path_factory.mktemp(name.removesuffix(".py"))
            run_script(scripts[name], *flags, "--run-dir", folder, echo=False, timeout=180)
            done[key] = read_metrics(folder)
        return done[key]

    return get


@pytest.fixture(scope="module")
def check(run):
    return {r["batchnorm"]: r for r in run("pipeline_check.py", *SIZES, "--micro-batches", 2)}


def test_one_pipelined_step_changes_the_weights_of_both_shards(check):
    for r in check.values():
        assert min(r["change"]) > 1e-4, r
        assert not any(r["grads_in_dot_grad"]), "distributed backward filled .grad"


def test_pipelined_step_equals_whole_model_step_with_running_statistics(check):
    assert check["eval"]["micro_batches"] == 2
    assert check["eval"]["max_diff"] < 1e-5, check["eval"]


def test_batchnorm_in_training_mode_makes_the_pipelined_step_differ(check):
    assert check["train"]["max_diff"] > 1e-3, check["train"]


def test_timeline_holds_one_forward_and_one_backward_per_micro_batch_on_each_shard(run):
    records = [r for r in run("pipeline_rpc.py", *SIZES, *TIMING) if "micro_batches" in r]
    assert [r["micro_batches"] for r in records] == [1, 2]
    for r in records:
        for shard, trace in enumerate(r["trace"]):
            phases = sorted((phase, k) for k, phase, _, _ in trace)
            numbers = sorted({k for _, k in phases})
            assert len(numbers) == r["micro_batches"], trace
            assert phases == sorted((p, k) for p in ("backward", "forward") for k in numbers), trace
            assert all(r["start"] <= begin <= end for _, _, begin, end in trace), trace
            assert 0 < r["busy"][shard] <= r["seconds"], r


def test_rpc_pipeline_and_pipelining_compute_the_same_loss(run):
    # (the notebook checks the single process against both)
    rpc = [r for r in run("pipeline_rpc.py", *SIZES, *TIMING) if r.get("micro_batches") == 1]
    gpipe = [r for r in run("pipeline_pp.py", *SIZES, *TIMING) if r["rank"] == 1 and r["micro_batches"] == 1]
    assert abs(rpc[0]["loss"] - gpipe[0]["loss"]) < 1e-4, (rpc, gpipe)


def test_pipelining_logs_every_micro_batch_count_on_both_ranks(run):
    records = run("pipeline_pp.py", *SIZES, *TIMING)
    assert sorted((r["rank"], r["micro_batches"]) for r in records) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert all(r["seconds"] > 0 for r in records)


@pytest.mark.parametrize("gpus, expected", [
    (0, ["cpu", "cpu"]), (1, ["cuda:0", "cuda:0"]), (2, ["cuda:0", "cuda:1"]), (4, ["cuda:0", "cuda:1"]),
])
def test_rpc_shards_take_a_gpu_each_share_one_or_stay_on_the_cpu(scripts, monkeypatch, gpus, expected):
    # the GPU paths cannot run here: check the choice the master makes from the placement launch gives it
    monkeypatch.syspath_prepend(str(scripts["pipeline_rpc.py"].parent))
    monkeypatch.delitem(sys.modules, "pipeline_rpc", raising=False)
    pipeline_rpc = importlib.import_module("pipeline_rpc")
    assert pipeline_rpc.shard_devices(pick_backend("auto", 3, "auto", gpus=gpus)) == expected
    assert pipeline_rpc.shard_devices(pick_backend("auto", 3, "cpu", gpus=gpus)) == ["cpu", "cpu"]




# in this process (no interpreter start per case); the notebook's last section runs five of them as scripts
@pytest.mark.parametrize("name, flags, message", [
    ("pipeline_rpc.py", ["--batch-size", 4, "--micro-batches", 8], "--micro-batches 8 is more than the 4 samples"),
    ("pipeline_check.py", ["--image-size", 32, "--batch-size", 8, "--micro-batches", 8],
     "leave BatchNorm one value per channel in layer4"),
    ("pipeline_pp.py", ["--split", "layer5"], "invalid choice: 'layer5'"),
    ("pipeline_rpc.py", ["--world-size", 2], "--world-size 2: this pipeline has 3 roles"),
    ("pipeline_pp.py", ["--world-size", 3], "--world-size 3: this pipeline has 2 stages"),
    ("pipeline_pp.py", ["--schedule", "1f1b", "--micro-batches", 1], "1f1b needs at least as many micro-batches"),
    ("pipeline_rpc.py", ["--micro-batches", 0], "must be an integer >= 1, got 0"),
    ("pipeline_pp.py", ["--image-size", 16], "must be an integer >= 32 and <= 1024, got 16"),
    ("single_process.py", ["--threads", 0], "must be an integer >= 1 and <= 64, got 0"),
], ids=["more-micro-batches-than-samples", "batchnorm-one-value", "unknown-split", "rpc-world-size",
        "pp-world-size", "1f1b-one-micro-batch", "no-micro-batch", "image-too-small", "no-threads"])
def test_bad_input_is_a_one_line_error_before_spawning(scripts, tmp_path, capsys, name, flags, message):
    with pytest.raises(SystemExit) as refused:
        run_in_this_process(scripts[name], *flags, "--run-dir", tmp_path)
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"{name}: error: ") and message in err[-1], err
