"""Lesson 12 (one step at scale): what the notebook does not check itself.

The notebook's check cells, run by nbmake in the quick profile, assert every claim of its runs: the bytes of
a step and how activations grow, checkpointing's saved bytes and equal gradients, accumulation with no_sync
equal to one process with its all-reduces counted (exercise 12a: its check is shown
failing here), bfloat16's bytes per collective and loss, one all-reduce
per DDP bucket and the overlap of many buckets, the compression hooks' bytes against their rules, FSDP2's
bytes per rank to 64 ranks with the fake process group, the compiled DDP step (its graphs by DDPOptimizer's rule,
equal to eager, its overlap, the refused cap and the compiled wrapper) and compiled FSDP2, and three refusals
started from the command line.
What is left: every script's flag checks, run in this process (no interpreter, no worker), the same seed
giving the same numbers, and the reading of part 5's timeline where no GPU is: its kernels, made up.
"""

import json

import pytest
from conftest import check_source, refusal, run_in_this_process, write_scripts

from helpers.exercises import ExerciseFailed, replace_solution, stub

NOTEBOOK = "12_one_step.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson12")
    return write_scripts(folder, NOTEBOOK)


@pytest.mark.parametrize("script, flags, message", [
    ("step_anatomy.py", ["--dim", 100, "--heads", 3], "--heads 3 must divide --dim 100"),
    ("step_anatomy.py", ["--batch-sizes", 0], "--batch-sizes: must be an integer >= 1"),
    ("step_checkpoint.py", ["--repeats", 0], "--repeats: must be an integer >= 1"),
    ("step_accumulate.py", ["--world-size", 2, "--micro-steps", 3, "--batch-size", 16],
     "--batch-size 16 must be a multiple of --world-size x --micro-steps = 6"),
    ("step_accumulate.py", ["--world-size", 0], "--world-size: must be an integer >= 1 and <= 64, got 0"),
    ("step_precision.py", ["--modes", "float8"], "invalid choice: 'float8'"),
    ("step_precision.py", ["--world-size", 3, "--batch-size", 16],
     "--batch-size 16 must be a multiple of --world-size 3"),
    ("step_overlap.py", ["--bucket-mb", 0], "--bucket-mb: must be a finite number > 0"),
    ("step_overlap.py", ["--world-size", 2, "--batch-size", 3], "--batch-size 3 must be a multiple of --world-size 2"),
    ("step_compress.py", ["--hooks", "powersgd1", "--bucket-mb", 0.1], "PowerSGD here needs the whole model"),
    ("step_compress.py", ["--steps", 4], "--steps: must be an integer >= 5"),
    ("step_fake_world.py", ["--world-sizes", 0], "--world-sizes: must be an integer >= 1"),
    ("step_compile.py", ["--bucket-mb", "default", 0], "--bucket-mb: must be a finite number > 0"),
    ("step_compile.py", ["--steps", 2], "--steps: must be an integer >= 3"),
    ("step_compile_fsdp.py", ["--world-size", 2, "--batch-size", 3],
     "--batch-size 3 must be a multiple of --world-size 2"),
], ids=["anatomy-heads", "anatomy-batch", "checkpoint-repeats", "accumulate-batch", "accumulate-world",
        "precision-mode", "precision-batch", "overlap-bucket", "overlap-batch", "compress-powersgd-bucket",
        "compress-steps", "fake-world-size", "compile-bucket", "compile-steps", "compile-fsdp-batch"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, script, flags, message):
    """The flag checks, run in this process: a refusal exits with 2 before launch() is reached."""
    folder = scripts[script].parent  # where a default --run-dir is made as the flags are read
    assert message in refusal(scripts[script], *flags, cwd=folder)


def test_same_seed_gives_the_same_gradients(scripts, tmp_path):
    """step_checkpoint.py twice with seed 0 and once with seed 1: the largest gradient repeats only with the seed."""
    largest = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        run_in_this_process(scripts["step_checkpoint.py"], "--batch-size", 2, "--repeats", 1, "--dim", 16,
                            "--hidden", 32, "--blocks", 1, "--seq-len", 8, "--device", "cpu", "--seed", seed,
                            "--run-dir", tmp_path / name)
        records = [json.loads(line) for line in (tmp_path / name / "rank0.jsonl").read_text().splitlines()]
        largest.append(records[-1]["grad_max"])
    assert largest[0] == largest[1] != largest[2]


ACCUMULATE = ["--world-size", 2, "--steps", 2, "--micro-steps", 2, "--batch-size", 8, "--dim", 32, "--hidden", 64]


def check_accumulate(scripts, tmp_path, source):
    """Exercise 12a's check on `source` in place of step_accumulate.py (2 ranks, 2 steps of 2 micro-batches)."""
    path = scripts["step_accumulate.py"].with_name("accumulate_under_test.py")  # beside step_model.py
    return check_source("12a", path, source, *ACCUMULATE, "--run-dir", tmp_path)


def test_exercise_12a_passes_the_solution_and_fails_the_stub_and_wrong_answers(scripts, tmp_path):
    source = scripts["step_accumulate.py"].read_text()
    assert "equal one process's steps" in check_accumulate(scripts, tmp_path, source)
    with pytest.raises(ExerciseFailed, match="^Exercise 12a: not written yet"):
        check_accumulate(scripts, tmp_path, stub(source))
    always_sync = replace_solution(source, "12a", "model.no_sync() if i < k - 1 else contextlib.nullcontext()",
                                   "contextlib.nullcontext()")
    with pytest.raises(ExerciseFailed, match=r"rank \d ran \d+ all-reduces in optimizer step 1, expected \d+: one per"):
        check_accumulate(scripts, tmp_path, always_sync)
    no_mean = replace_solution(source, "12a", "yi.flatten()) / k", "yi.flatten())")
    with pytest.raises(ExerciseFailed, match=r"rank \d weights element \[\d+\]: expected .*, got"):
        check_accumulate(scripts, tmp_path, no_mean)


@pytest.fixture
def overlap_reading(scripts, monkeypatch):
    """step_overlap.py's lanes() and overlap(), which the notebook reads its timeline with."""
    monkeypatch.syspath_prepend(str(scripts["step_overlap.py"].parent))
    import step_overlap

    return step_overlap.lanes, step_overlap.overlap


def gpu_step(buckets):
    """The rows of a made-up GPU step: forward, 8 backward kernels, then the optimizer. With one bucket its
    all-reduce starts after the last backward kernel; with 4, one after every second kernel. gloo reduces on the
    CPU (its rows are the CPU's); the device-side copies and the optimizer's kernel are not backward compute."""
    rows = [dict(name="forward", start_ms=0, ms=2, device="cpu", thread=1),
            dict(name="backward", start_ms=2, ms=20, device="cpu", thread=1),
            dict(name="optimizer", start_ms=22, ms=2, device="cpu", thread=1),
            dict(name="void sgd_kernel", start_ms=22.5, ms=1, device="cuda", thread=7)]
    rows += [dict(name=f"void backward_kernel_{k}", start_ms=3 + 2 * k, ms=1, device="cuda", thread=7)
             for k in range(8)]
    ready = [18] if buckets == 1 else [5, 9, 13, 18]  # when each bucket's all-reduce was started
    rows += [dict(name="gloo:all_reduce", start_ms=t, ms=3, device="cpu", thread=3) for t in ready]
    rows += [dict(name="Memcpy DtoH (Device -> Pinned)", start_ms=t + 0.1, ms=0.5, device="cuda", thread=9)
             for t in ready]
    return rows


def test_overlap_on_a_gpu_counts_backward_kernels_after_the_first_all_reduce(overlap_reading):
    lanes, overlap = overlap_reading
    for buckets, overlapped in ((1, 0), (4, 7)):  # kernels 1 to 7 start after the first of 4 all-reduces
        phases, ops, comm = lanes(gpu_step(buckets))
        assert sorted(phases) == ["backward", "forward", "optimizer"] and len(comm) == buckets
        assert [o["name"] for o in ops] == [f"void backward_kernel_{k}" for k in range(8)], "kernels of backward only"
        assert overlap(gpu_step(buckets)) == overlapped


def test_overlap_on_the_cpu_reads_the_autograd_engines_thread(overlap_reading):
    lanes, overlap = overlap_reading
    rows = [dict(name="backward", start_ms=0, ms=10, device="cpu", thread=1),
            dict(name="gloo:all_reduce", start_ms=4, ms=2, device="cpu", thread=3)]
    rows += [dict(name="autograd::engine::evaluate_function: MmBackward0", start_ms=k, ms=1, device="cpu",
                  thread=1) for k in range(0, 10, 2)]  # starts 0, 2, 4, 6, 8
    rows += [dict(name="autograd::engine::evaluate_function: AddBackward0", start_ms=5, ms=1, device="cpu",
                  thread=5)]  # an engine op on another thread: not the backward lane
    _, ops, comm = lanes(rows)
    assert {o["thread"] for o in ops} == {1} and len(ops) == 5 and len(comm) == 1
    assert overlap(rows) == 3


def test_overlap_on_the_cpu_counts_from_the_all_reduces_call_when_gloos_thread_starts_it_late(overlap_reading):
    """On a busy machine gloo's thread may start the reduction after backward has ended: the overlap is counted
    from the call (`c10d::allreduce_` on backward's thread), which is when DDP handed the bucket over."""
    _, overlap = overlap_reading
    rows = [dict(name="backward", start_ms=0, ms=10, device="cpu", thread=1),
            dict(name="c10d::allreduce_", start_ms=4, ms=0.1, device="cpu", thread=1),
            dict(name="gloo:all_reduce", start_ms=11, ms=2, device="cpu", thread=3)]
    rows += [dict(name="autograd::engine::evaluate_function: MmBackward0", start_ms=k, ms=1, device="cpu",
                  thread=1) for k in range(0, 10, 2)]  # starts 0, 2, 4, 6, 8
    assert overlap(rows) == 3
    assert overlap([r for r in rows if r["name"] != "c10d::allreduce_"]) == 0, "gloo's start alone: none"
