"""Lesson 00 (orientation, RPC primer): the notebook's scripts, run for real with small settings."""

import time

import pytest
import torch
from conftest import refusal

from helpers.launch import ScriptError, pick_backend, run_script
from helpers.metrics import read_metrics

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
    assert f"[rank 0] path: {pick_backend('auto', 3)}" in out, out


def test_failing_rank_ends_the_run_with_its_traceback(scripts):
    start = time.perf_counter()
    with pytest.raises(ScriptError) as failure:
        run(scripts, "hello_ranks.py", "--world-size", 2, "--fail-rank", 0)
    assert "ZeroDivisionError: rank 0 fails on purpose" in str(failure.value)
    assert time.perf_counter() - start < 60


def test_to_here_copies_on_a_user_and_returns_the_object_on_its_owner(scripts, tmp_path):
    run(scripts, "rpc_primer.py", "--run-dir", tmp_path)
    (r,) = read_metrics(tmp_path)
    assert r["owner"] == "worker1" and r["caller_owns"] is False
    assert (r["after_calls"], r["copy"], r["on_owner"]) == (7, 107, 7)
    assert r["same_object"] is True and r["after_owner_add"] == 17


def test_latency_measures_every_size_and_echoes_intact_on_loopback(scripts, tmp_path):
    run(scripts, "rpc_latency.py", "--max-bytes", 4096, "--repeats", 3, "--run-dir", tmp_path)
    records = read_metrics(tmp_path)
    points = [r for r in records if "bytes" in r]
    assert [r["bytes"] for r in points] == [4, 16, 64, 256, 1024, 4096]
    assert all(r["repeats"] == 3 and r["intact"] == 3 and r["fastest"] <= r["seconds"] for r in points)
    listening = {ip for r in records if "listening" in r for ip in r["listening"]}
    assert listening and listening <= {"127.0.0.1", "::1"}, listening


@pytest.mark.parametrize("script, flags, message", [
    ("hello_ranks.py", ["--world-size", 0], "--world-size: must be an integer >= 1 and <= 64, got 0"),
    ("hello_ranks.py", ["--world-size", 2, "--fail-rank", 5], "--fail-rank 5 is not a rank of a world of 2"),
    ("hello_ranks.py", ["--device", "tpu"], "invalid choice: 'tpu'"),
    pytest.param("hello_ranks.py", ["--backend", "nccl"], "needs one GPU per rank",
                 marks=pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="NCCL can run here")),
    ("rpc_primer.py", ["--run-dir", "/proc/no/such/folder"],
     "argument --run-dir: cannot create folder '/proc/no/such/folder'"),
    ("rpc_latency.py", ["--max-bytes", 2, "--run-dir", "x"], "--max-bytes: must be an integer >= 4"),
], ids=["world-size-0", "fail-rank-outside-world", "unknown-device", "nccl-without-gpus", "run-dir-not-creatable",
        "max-bytes-below-4"])
def test_bad_flags_fail_in_one_line_before_any_worker_starts(scripts, script, flags, message, tmp_path):
    assert message in refusal(scripts[script], *flags, cwd=tmp_path)


def test_a_refused_flag_is_exit_code_2_and_one_line_from_the_command_line(scripts, tmp_path):
    with pytest.raises(ScriptError) as failure:
        run_script(scripts["hello_ranks.py"], "--world-size", 0, echo=False, timeout=60, cwd=tmp_path)
    first_line = str(failure.value).splitlines()[0]
    assert "exit code 2" in first_line and "--world-size: must be an integer >= 1" in first_line, str(failure.value)
    assert "[rank" not in str(failure.value) and "Traceback" not in str(failure.value)
