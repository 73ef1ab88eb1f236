"""Lesson 05 (pipeline parallelism): what the notebook's own runs do not show.

The notebook's quick run launches every script on tiny images, and its check cells assert the lesson's
claims on those runs: the pipelined step against the whole model (both BatchNorm modes), the timeline of
every micro-batch on both shards, both ranks of both pipelining schedules, the same loss in every
implementation, and one bad flag from the command line. Here: a run with the most micro-batches the RPC flag
accepts (64, far beyond TensorPipe's default thread pool), torch.distributed.pipelining with two micro-batch
counts under input validation, the float32 settings of a GPU run, exercise 05a's check failing on its stub and
on two wrong loops, and, without starting a worker, the devices the shards take for each GPU count and every bad
flag of every script, on main() in this process.
"""

import importlib
import sys

import pytest
import torch
from conftest import refusal, write_scripts

from helpers.compare import exact_math
from helpers.exercises import ExerciseFailed, check_script, replace_solution, stub
from helpers.launch import pick_backend
from helpers.metrics import read_metrics
from helpers.runner import run_script

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


def test_the_most_micro_batches_the_rpc_flag_accepts_run_to_the_end(scripts, tmp_path):
    # each waiting forward holds an RPC thread: with TensorPipe's default pool of 16 this hung until the time-out;
    # the pool grows with the count, which the flag caps: its largest value runs, with uneven micro-batches too
    most = 64  # pipeline_rpc.MOST_MICRO_BATCHES
    run_script(scripts["pipeline_rpc.py"], "--image-size", 40, "--batch-size", most + 2, "--micro-batches", 3, most,
               "--batches", 1, "--warmup", 0, "--idle", 0,
               "--malloc-arenas", 0,  # the C library's default: MALLOC_ARENA_MAX unset, launch may fork the workers
               "--run-dir", tmp_path, echo=False, timeout=180)
    records = [r for r in read_metrics(tmp_path) if "micro_batches" in r]
    assert [r["micro_batches"] for r in records] == [3, most]
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
    ("pipeline_rpc.py", ["--micro-batches", 0], "must be an integer >= 1 and <= 64, got 0"),
    ("pipeline_pp.py", ["--image-size", 16], "must be an integer >= 32 and <= 1024, got 16"),
    ("pipeline_single_process.py", ["--threads", 0], "must be an integer >= 1 and <= 64, got 0"),
    ("pipeline_pp.py", ["--batch-size", 32, "--micro-batches", 4, 3],
     "--micro-batches 3 does not divide --batch-size 32"),
    ("pipeline_rpc.py", ["--batch-size", 128, "--micro-batches", 65], "must be an integer >= 1 and <= 64, got 65"),
], ids=["more-micro-batches-than-samples", "batchnorm-one-value", "unknown-split", "rpc-world-size",
        "pp-world-size", "1f1b-one-micro-batch", "no-micro-batch", "image-too-small", "no-threads",
        "pp-uneven-micro-batches", "rpc-pool-cap"])
def test_bad_input_is_a_one_line_error_before_spawning(scripts, tmp_path, name, flags, message):
    error = refusal(scripts[name], *flags, "--run-dir", tmp_path)
    assert error.startswith(f"{name}: error: ") and message in error, error


@pytest.mark.parametrize("name", ["pipeline_rpc.py", "pipeline_check.py"])
def test_shared_memory_transport_is_refused_off_linux(scripts, tmp_path, monkeypatch, name):
    monkeypatch.setattr(sys, "platform", "darwin")
    error = refusal(scripts[name], "--transport", "shm", "--run-dir", tmp_path)
    assert "--transport shm: TensorPipe has a shared-memory transport on Linux only" in error, error


def test_pipelining_builds_a_stage_per_micro_batch_count(scripts, tmp_path):
    # one stage serving two micro-batch shapes fails input validation, which DETAIL turns on in torch 2.14
    run_script(scripts["pipeline_pp.py"], "--image-size", 32, "--batch-size", 8, "--micro-batches", 4, 2,
               "--batches", 1, "--warmup", 0, "--run-dir", tmp_path, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
               echo=False, timeout=120)
    assert sorted((r["rank"], r["micro_batches"]) for r in read_metrics(tmp_path)) == [(0, 2), (0, 4), (1, 2), (1, 4)]


def test_exact_math_turns_tf32_off_and_cudnn_deterministic_on_a_gpu_only():
    # every script of the lesson calls helpers.compare.exact_math (it replaced resnet_shards.float32_math)
    flags = (torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32"), \
        (torch.backends.cudnn, "deterministic"), (torch.backends.cudnn, "benchmark")
    saved = [getattr(module, name) for module, name in flags]
    try:
        for module, name in flags:
            setattr(module, name, name != "deterministic")
        exact_math("cpu")
        assert [getattr(m, n) for m, n in flags] == [True, True, False, True], "the CPU needs none of it"
        exact_math("cuda:0")
        assert [getattr(m, n) for m, n in flags] == [False, False, True, False]
    finally:
        for (module, name), value in zip(flags, saved, strict=True):
            setattr(module, name, value)


LOOP = ["--image-size", 32, "--batch-size", 8, "--micro-batches", 4]  # the smallest step the check can judge


@pytest.fixture(scope="module")
def loop_source(scripts):
    return scripts["pipeline_loop.py"].read_text()


def test_exercise_05a_check_fails_on_the_stub(scripts, loop_source):
    scripts["pipeline_loop.py"].write_text(stub(loop_source))
    try:
        with pytest.raises(ExerciseFailed, match="^Exercise 05a: not written yet"):
            check_script("05a", scripts["pipeline_loop.py"], *LOOP, timeout=120, echo=False)
    finally:
        scripts["pipeline_loop.py"].write_text(loop_source)


def test_exercise_05a_check_fails_on_a_loop_that_waits_for_each_micro_batch(scripts, loop_source):
    waiting = replace_solution(loop_source, "05a", new="""
        outputs = []
        for chunk in x.tensor_split(m):
            k = next(numbers)
            h = rpc.remote(pair[0].owner(), call_method, args=(Shard.forward, pair[0], k, rpc.RRef(chunk)))
            outputs.append(rpc.rpc_sync(pair[1].owner(), call_method, args=(Shard.forward, pair[1], k, h)))
        return torch.cat(outputs)
        """)
    scripts["pipeline_loop.py"].write_text(waiting)
    try:
        with pytest.raises(ExerciseFailed, match=r"^Exercise 05a: no overlap: for every k of 3, shard 1 began"):
            check_script("05a", scripts["pipeline_loop.py"], *LOOP, timeout=120, echo=False)
    finally:
        scripts["pipeline_loop.py"].write_text(loop_source)


def test_exercise_05a_check_fails_on_logits_gathered_out_of_order(scripts, loop_source):
    reversed_order = replace_solution(loop_source, "05a", "torch.futures.wait_all(futures)",
                                      "torch.futures.wait_all(futures[::-1])")
    scripts["pipeline_loop.py"].write_text(reversed_order)
    try:
        with pytest.raises(ExerciseFailed, match=r"^Exercise 05a: logits element \[0, \d+\]: expected .*, got "):
            check_script("05a", scripts["pipeline_loop.py"], *LOOP, timeout=120, echo=False)
    finally:
        scripts["pipeline_loop.py"].write_text(loop_source)
