"""Lesson 00 (orientation, RPC primer): what the notebook's run does not cover.

The notebook's check cells assert the RPC primer's and the latency script's claims on its own runs; these tests
run hello_ranks with three ranks and with rank 0 failing (the notebook: two ranks, rank 1 failing), the latency
script's sizes, exercise 00a's check on its stub and on a wrong answer, and the scripts' refusals of bad flags.
"""

import time

import pytest
import torch
from conftest import check_source, refusal

from helpers.exercises import ExerciseFailed, replace_solution, stub
from helpers.launch import pick_backend
from helpers.metrics import read_metrics
from helpers.runner import ScriptError, run_script

NOTEBOOK = "00_orientation.ipynb"


@pytest.fixture
def scripts(lesson_scripts):
    return lesson_scripts(NOTEBOOK)


def run(scripts, name, *flags, timeout=120):
    return run_script(scripts[name], *flags, echo=False, timeout=timeout)


def test_every_rank_says_hello_and_rank_0_names_the_path(scripts):
    out = run(scripts, "hello_ranks.py", "--world-size", 3).output
    hellos = [line for line in out.splitlines() if "hello on" in line]
    assert len(hellos) == 3 and all("sum of ranks = 3" in line for line in hellos), out
    assert f"[rank 0] path: {pick_backend('auto', 3)}; workers started by " in out, out
    assert out.split("workers started by ")[1].split()[0] in ("fork", "spawn"), "how launch started them"


def test_failing_rank_ends_the_run_with_its_traceback(scripts):
    start = time.perf_counter()
    with pytest.raises(ScriptError) as failure:
        run(scripts, "hello_ranks.py", "--world-size", 2, "--fail-rank", 0)
    assert "ZeroDivisionError: rank 0 fails on purpose" in str(failure.value)
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize("script, flags, message", [
    ("hello_ranks.py", ["--world-size", 0], "--world-size: must be an integer >= 1 and <= 64, got 0"),
    ("hello_ranks.py", ["--world-size", 2, "--fail-rank", 5], "--fail-rank 5 is not a rank of a world of 2"),
    ("hello_ranks.py", ["--work-seconds", -1], "--work-seconds: must be a finite number >= 0"),
    ("hello_ranks.py", ["--device", "tpu"], "invalid choice: 'tpu'"),
    ("hello_ranks.py", ["--init-method", "/tmp/meet"], "--init-method '/tmp/meet' must start with file://"),
    pytest.param("hello_ranks.py", ["--backend", "nccl"], "needs one GPU per rank",
                 marks=pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="NCCL can run here")),
    ("rpc_primer.py", ["--run-dir", "a-file/runs"], "argument --run-dir: cannot create folder 'a-file/runs'"),
    ("rpc_latency.py", ["--max-bytes", 2, "--run-dir", "x"], "--max-bytes: must be an integer >= 4"),
    ("start_methods.py", ["--world-sizes", 2, 0], "--world-sizes: must be an integer >= 1 and <= 16, got 0"),
], ids=["world-size-0", "fail-rank-outside-world", "work-seconds-negative", "unknown-device", "init-method-not-a-url",
        "nccl-without-gpus", "run-dir-not-creatable", "max-bytes-below-4", "start-world-size-0"])
def test_bad_flags_fail_in_one_line_before_any_worker_starts(scripts, script, flags, message, tmp_path):
    (tmp_path / "a-file").write_text("")  # no folder can be made inside a file, on any system, even as root
    assert message in refusal(scripts[script], *flags, cwd=tmp_path)


def test_start_methods_times_both_methods_for_each_world_size_and_names_launchs_choice(scripts):
    out = run(scripts, "start_methods.py", "--world-sizes", 1, 3).output
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["3"])]
    assert sorted((r[0], r[2]) for r in rows) == [("1", "fork"), ("1", "spawn"), ("3", "fork"), ("3", "spawn")], out
    assert all(float(r[3]) > 0 and float(r[4]) >= float(r[3]) for r in rows), "ready comes before joined"
    assert out.split("launch starts workers here with: ")[1].split()[0] in ("fork", "spawn")
    assert f"path: {pick_backend('auto', 3, device='cpu')}" in out, "the path line of the CPU workers it times"


def test_a_refused_flag_is_exit_code_2_and_one_line_from_the_command_line(scripts, tmp_path):
    with pytest.raises(ScriptError) as failure:
        run_script(scripts["hello_ranks.py"], "--world-size", 0, echo=False, timeout=60, cwd=tmp_path)
    first_line = str(failure.value).splitlines()[0]
    assert "exit code 2" in first_line and "--world-size: must be an integer >= 1" in first_line, str(failure.value)
    assert "[rank" not in str(failure.value) and "Traceback" not in str(failure.value)


def test_latency_measures_every_size_and_a_round_trip_costs_more_than_a_copy(scripts, tmp_path):
    run(scripts, "rpc_latency.py", "--max-bytes", 1024, "--repeats", 3, "--run-dir", tmp_path)
    points = [r for r in read_metrics(tmp_path) if "bytes" in r]
    assert [r["bytes"] for r in points] == [4, 16, 64, 256, 1024]
    assert all(r["intact"] == r["repeats"] == 3 for r in points)
    assert all(0 < r["local_fastest"] < r["fastest"] for r in points), points


def test_exercise_00a_check_fails_on_the_stub_and_on_a_call_on_a_local_copy(scripts):
    path = scripts["remote_method_exercise.py"]
    source = path.read_text()
    assert check_source("00a", path, source, timeout=120).startswith("Exercise 00a: add(5), add(2)")
    # the learner's version keeps the function's signature: only its body is replaced
    assert "\ndef my_remote_method(method, rref, *args, **kwargs):\n" in stub(source)
    with pytest.raises(ExerciseFailed, match="^Exercise 00a: not written yet"):
        check_source("00a", path, stub(source), timeout=120)
    # to_here() on the caller: the method changes a copy, here, and the owner's Counter never moves
    local_copy = replace_solution(
        source, "00a", "return rpc.rpc_sync(rref.owner(), my_remote_method, args=(method, rref, *args), kwargs=kwargs)",
        "return method(rref.to_here(), *args, **kwargs)")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 00a: then add\(2\): expected 7, got 2$"):
        check_source("00a", path, local_copy, timeout=120)
