"""Lesson 02 (DistributedDataParallel): what the notebook's run does not cover.

The notebook's check cells assert the lesson's claims on its own runs of ddp_step, ddp_checkpoint, ddp_split,
ddp_mnist, ddp_proof (also under torchrun), ddp_scaling and ddp_buckets; these tests add the scaling script's
records for both thread settings, exercise 02a's check on its stub and on wrong answers (a division by 2,
caught at 3 ranks), a rank that leaves its loop early (gloo's mismatch ends the run at once; Join lets the
other finish), that only a launch (not every torchrun rank) may download MNIST, and the scripts' refusals of
bad flags.
"""

import pytest
import torch
from conftest import check_source, refusal, run_in_this_process

from helpers.exercises import ExerciseFailed, replace_solution, stub
from helpers.metrics import read_metrics
from helpers.runner import ScriptError, run_script

NOTEBOOK = "02_ddp.ipynb"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture
def scripts(lesson_scripts):
    return lesson_scripts(NOTEBOOK)


def run(scripts, name, *flags, **kwargs):
    return run_script(scripts[name], *flags, echo=False, timeout=kwargs.pop("timeout", 180), **kwargs)


def test_scaling_times_compute_allreduce_and_step_for_every_setting(scripts, tmp_path):
    run(scripts, "ddp_scaling.py", "--world-size", 2, "--threads", 1, 0, "--batch-sizes", 4, 32, "--steps", 2,
        "--rounds", 2, "--run-dir", tmp_path / "run")
    records = read_metrics(tmp_path / "run")
    assert [(r["threads_flag"], r["batch"]) for r in records] == [(1, 4), (0, 4), (1, 32), (0, 32)]  # in turns
    for r in records:
        assert r["world_size"] == 2 and (r["threads"] == 1 if r["threads_flag"] == 1 else r["threads"] >= 1)
        assert 0 < r["allreduce"] and 0 < r["compute"] and 0 < r["seconds"]
        assert r["samples_per_s"] == pytest.approx(2 * r["batch"] / r["seconds"])


def test_a_rerun_into_the_same_run_dir_replaces_the_last_runs_metrics(scripts, tmp_path):
    for _ in range(2):  # as a learner re-running a "what to try next" command
        out = run(scripts, "ddp_buckets.py", "--world-size", 2, "--steps", 2, "--run-dir", tmp_path).output
        assert "path: " in out
        assert [r["model"] for r in read_metrics(tmp_path)] == ["convnet", "mlp"], "the last run's lines remain"


@pytest.mark.parametrize("script, flags, message", [
    ("ddp_step.py", ["--world-size", 0, "--run-dir", "x"], "--world-size: must be an integer >= 1"),
    ("ddp_checkpoint.py", ["--steps", 0, "--run-dir", "x"], "--steps: must be an integer >= 1"),
    pytest.param("ddp_split.py", ["--device", "cuda", "--run-dir", "x"], "no GPU is visible here",
                 marks=pytest.mark.skipif(GPUS > 0, reason="there is a GPU here")),
    ("ddp_mnist.py", ["--lr", -1], "--lr: must be a finite number"),
    ("ddp_mnist.py", ["--world-size", 3, "--batch-size", 64], "cannot be split evenly over --world-size 3"),
    ("ddp_mnist.py", ["--run-dir", "a-file/runs"], "argument --run-dir: cannot create folder 'a-file/runs'"),
    ("ddp_proof.py", ["--steps", 1000], "more than the"),
    ("ddp_scaling.py", ["--batch-sizes", 16, 0], "--batch-sizes: must be an integer >= 1"),
], ids=["step-world-size-0", "checkpoint-steps-0", "split-cuda-without-gpu", "mnist-lr-negative",
        "mnist-batch-not-divisible", "mnist-run-dir-not-creatable",
        "proof-steps-beyond-data", "scaling-batch-size-0"])
def test_bad_flags_fail_in_one_line_before_any_worker_starts(scripts, script, flags, message, tmp_path):
    (tmp_path / "a-file").write_text("")  # no folder can be made inside a file, on any system, even as root
    assert message in refusal(scripts[script], *flags, cwd=tmp_path)


def test_exercise_02a_check_fails_on_the_stub_a_missing_division_and_averaged_weights(scripts):
    path = scripts["ddp_by_hand.py"]
    source = path.read_text()
    assert check_source("02a", path, source, timeout=120).endswith("every gradient equals DDP's")
    with pytest.raises(ExerciseFailed, match="^Exercise 02a: not written yet"):
        check_source("02a", path, stub(source), timeout=120)
    summed = replace_solution(source, "02a", "        p.grad /= world_size\n", "")  # the sum, not the mean
    with pytest.raises(ExerciseFailed, match=r"^Exercise 02a: rank \d, parameter hidden\.weight, element \[\d+, \d+\]: "
                                             r"expected -?[\d.e-]+, got -?[\d.e-]+ \(\d+ of 128 elements differ\)"):
        check_source("02a", path, summed, timeout=120)
    averaged_weights = replace_solution(source, "02a", new="""
        for p in model.parameters():  # the weights averaged instead of the gradients
            dist.all_reduce(p.data)
            p.data /= world_size
        """)
    with pytest.raises(ExerciseFailed, match=r"^Exercise 02a: rank \d, parameter hidden\.weight, element"):
        check_source("02a", path, averaged_weights, timeout=120)


def test_exercise_02a_check_at_three_ranks_fails_on_a_division_by_two(scripts):
    # at 2 ranks dividing by 2 is dividing by the world size; the notebook checks at 3 too, where it is not
    path = scripts["ddp_by_hand.py"]
    halved = replace_solution(path.read_text(), "02a", "p.grad /= world_size", "p.grad /= 2")
    assert check_source("02a", path, halved, "--world-size", 2, timeout=120).endswith("every gradient equals DDP's")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 02a: rank \d, parameter hidden\.weight, element"):
        check_source("02a", path, halved, "--world-size", 3, timeout=120)


def rank_1_stops_early(source):
    """ddp_mnist.py with rank 1 leaving its loop after 3 steps, the item of the lesson's "what to try next"."""
    old = "            if step == args.max_steps:\n                break\n        seconds"
    assert old in source
    return source.replace(old, "            if step == args.max_steps or (worker.rank == 1 and step == 3):\n"
                                "                break\n        seconds")


def test_a_rank_that_stops_early_ends_the_run_at_once_and_join_lets_the_other_finish(scripts, tmp_path):
    path = scripts["ddp_mnist.py"]
    early = rank_1_stops_early(path.read_text())
    path.write_text(early)
    flags = ["--max-steps", 10, "--log-every", 1, "--run-dir", tmp_path / "early"]
    with pytest.raises(ScriptError, match="rank 1 died") as died:  # no timeout: gloo sees the mismatch at once
        run(scripts, "ddp_mnist.py", *flags, timeout=120)
    assert "Received data size doesn't match expected size" in str(died.value) + died.value.output
    # the loop inside Join: the finished rank shadows the all-reduces it misses, and both evaluate
    loop = early[early.index("        for x, y in loader:"):early.index("        seconds = time.perf_counter()")]
    joined = early.replace(loop, "        with torch.distributed.algorithms.Join([ddp]):\n"
                           + "".join("    " + line if line.strip() else line for line in loop.splitlines(True)))
    path.write_text(joined.replace("import torch.distributed as dist\n",
                                   "import torch.distributed as dist\nimport torch.distributed.algorithms\n"))
    run(scripts, "ddp_mnist.py", *flags[:-1], tmp_path / "joined", timeout=120)
    records = read_metrics(tmp_path / "joined")
    assert max(r["step"] for r in records if r["rank"] == 0) == 10 and [r["step"] for r in records if "loss" in r
                                                                        and r["rank"] == 1] == [1, 2, 3]
    assert any("accuracy" in r for r in records), "rank 0 evaluated after the loop"


@pytest.mark.parametrize("torchrun", [False, True], ids=["launch", "torchrun"])
def test_mnist_is_downloaded_only_when_launch_starts_the_ranks(scripts, torchrun, monkeypatch, tmp_path):
    import helpers.data

    asked, load = [], helpers.data.load_mnist
    monkeypatch.setattr(helpers.data, "load_mnist", lambda download=True, **kw: asked.append(download) or
                        load(download=False, **kw))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    if torchrun:
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(AssertionError, match="got past its flag checks to launch"):
        run_in_this_process(scripts["ddp_mnist.py"], "--world-size", 2, cwd=tmp_path)
    assert asked == [not torchrun]
