"""Lesson 05 (pipeline parallelism): what the notebook's own runs do not show.

The notebook's quick run launches every script on tiny images, and its check cells assert the lesson's
claims on those runs: the pipelined step against the whole model (both BatchNorm modes), the timeline of
every micro-batch on both shards, both ranks of both pipelining schedules, the same loss in every
implementation, and one bad flag from the command line. Here: a run with more micro-batches in flight than
TensorPipe's default thread pool (16 and 32 micro-batches of one image), and, without starting a worker, the
devices the shards take for each GPU count and every bad flag of every script, on main() in this process.
"""

import importlib
import sys

import pytest
from conftest import refusal, write_scripts

from helpers.launch import pick_backend, run_script
from helpers.metrics import read_metrics

NOTEBOOK = "05_pipeline.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson05")
    return write_scripts(folder, NOTEBOOK)


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


def test_micro_batches_beyond_the_rpc_thread_pool_run_to_the_end(scripts, tmp_path):
    # each waiting forward holds an RPC thread: with TensorPipe's default pool of 16 this hung until the time-out
    run_script(scripts["pipeline_rpc.py"], "--image-size", 40, "--batch-size", 32, "--micro-batches", 16, 32,
               "--batches", 1, "--warmup", 0, "--idle", 0, "--run-dir", tmp_path, echo=False, timeout=120)
    records = [r for r in read_metrics(tmp_path) if "micro_batches" in r]
    assert [r["micro_batches"] for r in records] == [16, 32]
    for r in records:
        for trace in r["trace"]:  # every micro-batch went forward and backward through both shards
            assert sorted(k for k, phase, *_ in trace if phase == "backward") == sorted(
                k for k, phase, *_ in trace if phase == "forward") and len(trace) == 2 * r["micro_batches"]


# in this process (no interpreter start per case); the notebook's last section starts five of them as scripts
# (the first one in the quick profile)
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
    ("pipeline_single_process.py", ["--threads", 0], "must be an integer >= 1 and <= 64, got 0"),
], ids=["more-micro-batches-than-samples", "batchnorm-one-value", "unknown-split", "rpc-world-size",
        "pp-world-size", "1f1b-one-micro-batch", "no-micro-batch", "image-too-small", "no-threads"])
def test_bad_input_is_a_one_line_error_before_spawning(scripts, tmp_path, name, flags, message):
    error = refusal(scripts[name], *flags, "--run-dir", tmp_path)
    assert error.startswith(f"{name}: error: ") and message in error, error
