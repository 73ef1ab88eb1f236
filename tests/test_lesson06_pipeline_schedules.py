"""Lesson 06 (pipeline schedules): what the notebook's own runs do not show.

The notebook's quick run proves every schedule equal to one process, measures the activations held against the
simulator's count and runs exercise 06a's lists and the hand-written 1F1B on two ranks. Here: every bad flag of
the lesson's scripts refused in one line before anything starts (odd micro-batch counts the interleaved
schedules would refuse inside the workers, more micro-batches than samples), exercise 06a's check failing on its
stub and on three wrong lists (a backward before its forward, GPipe's memory, no warm-up and so no overlap), the
schedule simulator on lists that are no schedule, and the hand-written 1F1B on 4 ranks.
"""

import importlib

import pytest
from conftest import check_source, refusal, write_scripts

from helpers.exercises import ExerciseFailed, replace_solution, stub
from helpers.metrics import read_metrics
from helpers.runner import run_script

NOTEBOOK = "06_pipeline_schedules.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson06")
    return write_scripts(folder, NOTEBOOK)


@pytest.mark.parametrize("name, flags, message", [
    ("pipeline_schedules.py", ["--world-size", 3], "--world-size 3: the layouts here are for 2 ranks"),
    ("pipeline_schedules.py", ["--batch-size", 20, "--micro-batches", 8], "--micro-batches 8 does not divide"),
    ("pipeline_schedules.py", ["--micro-batches", 2], "must be an integer >= 4, got 2"),
    ("pipeline_schedules.py", ["--batch-size", 35, "--micro-batches", 5], "--micro-batches 5: the interleaved"),
    ("pipeline_schedules.py", ["--batch-size", 63, "--micro-batches", 7], "--micro-batches 7: the interleaved"),
    ("pipeline_schedules.py", ["--batch-size", 63, "--micro-batches", 9], "--micro-batches 9: the interleaved"),
    ("schedule_1f1b.py", ["--run", "--micro-batches", 32], "--micro-batches 32 does not divide --batch-size 16"),
    ("pipeline_1f1b_sendrecv.py", ["--world-size", 3], "--world-size 3: the 8 blocks must split evenly"),
    ("pipeline_1f1b_sendrecv.py", ["--micro-batches", 5], "--micro-batches 5 does not divide --batch-size 64"),
], ids=["schedules-world-size", "schedules-uneven-micro-batches", "schedules-dualpipev-micro-batches",
        "interleaved-5", "interleaved-7", "interleaved-9", "exercise-more-micro-batches-than-samples",
        "by-hand-world-size", "by-hand-uneven-micro-batches"])
def test_bad_input_is_a_one_line_error_before_spawning(scripts, tmp_path, name, flags, message):
    error = refusal(scripts[name], *flags, *(["--run-dir", tmp_path] if name != "schedule_1f1b.py" else []))
    assert error.startswith(f"{name}: error: ") and message in error, error


def test_odd_micro_batches_run_when_the_interleaved_schedules_are_left_out(scripts, tmp_path):
    run_script(scripts["pipeline_schedules.py"], "--schedules", "1f1b", "zbv", "--width", 16, "--batch-size", 10,
               "--micro-batches", 5, "--steps", 1, "--warmup", 1, "--run-dir", tmp_path, echo=False, timeout=120)
    timed = [r for r in read_metrics(tmp_path) if "rows" in r and not r["warmup"]]
    assert sorted((r["schedule"], r["rank"]) for r in timed) == [("1f1b", 0), ("1f1b", 1), ("zbv", 0), ("zbv", 1)]
    # the activations held, counted by hooks: 1F1B's p - rank; ZBV's at most 1F1B's count of pairs on each rank
    assert [r["held_peak"] for r in sorted(timed, key=lambda r: (r["schedule"], r["rank"]))][:2] == [2, 1]


def test_hand_written_1f1b_on_four_ranks_holds_p_minus_rank_and_equals_one_process(scripts, tmp_path):
    run_script(scripts["pipeline_1f1b_sendrecv.py"], "--world-size", 4, "--micro-batches", 8, "--run-dir", tmp_path,
               echo=False, timeout=120)
    records = sorted(read_metrics(tmp_path), key=lambda r: r["rank"])
    assert [r["held"] for r in records] == [4, 3, 2, 1]
    assert [r["sent"] for r in records] == [8, 16, 16, 8]  # the middle ranks send both ways
    assert all(r["max_diff"] <= 1e-12 * r["largest_grad"] for r in records)


# exercise 06a: the simulator's part of the check, without a worker (the notebook's check also runs the lists, --run)
@pytest.fixture(scope="module")
def schedule_source(scripts):
    return scripts["schedule_1f1b.py"].read_text()


@pytest.fixture
def variant(scripts):
    """Where a test writes its version of schedule_1f1b.py: beside it (it imports the lesson's other scripts)."""
    return scripts["schedule_1f1b.py"].with_name("schedule_1f1b_variant.py")


def test_exercise_06a_check_fails_on_the_stub(variant, schedule_source):
    with pytest.raises(ExerciseFailed, match="^Exercise 06a: not written yet"):
        check_source("06a", variant, stub(schedule_source), timeout=120)


def test_exercise_06a_check_fails_on_a_backward_before_its_forward(variant, schedule_source):
    swapped = replace_solution(schedule_source, "06a", new="""
        lists = {}
        for rank in range(p):
            warmup = min(p - rank - 1, m)
            actions = [f"F{k}" for k in range(warmup)]
            for k in range(m - warmup):
                actions += [f"B{k}", f"F{warmup + k}"]  # the backward first: on the last rank, before its forward
            lists[rank] = actions + [f"B{k}" for k in range(m - warmup, m)]
        return lists
        """)
    with pytest.raises(ExerciseFailed, match=r"^Exercise 06a: p=2, m=4: rank 1: 1B0 comes before 1F0, which it needs"):
        check_source("06a", variant, swapped, timeout=120)


def test_exercise_06a_check_fails_on_gpipe_claiming_1f1b_memory(variant, schedule_source):
    gpipe = replace_solution(schedule_source, "06a", new="""
        return {rank: [f"F{k}" for k in range(m)] + [f"B{k}" for k in range(m)] for rank in range(p)}
        """)
    with pytest.raises(ExerciseFailed, match=r"^Exercise 06a: p=2, m=4: rank 0 holds 4 micro-batches at its peak; "
                                             r"1F1B holds at most p - rank = 2"):
        check_source("06a", variant, gpipe, timeout=120)


def test_exercise_06a_check_fails_on_lists_without_a_warm_up(variant, schedule_source):
    # every rank runs each forward and then its backward: dependencies and memory hold, no two stages overlap
    serial = replace_solution(schedule_source, "06a", new="""
        return {rank: [a for k in range(m) for a in (f"F{k}", f"B{k}")] for rank in range(p)}
        """)
    with pytest.raises(ExerciseFailed, match=r"^Exercise 06a: p=2, m=4: the step takes \d+ units at F=1, B=2; "
                                             r"1F1B's takes \(m \+ p - 1\)\(F \+ B\) = 15"):
        check_source("06a", variant, serial, timeout=120)


def test_simulator_names_a_deadlock_between_ranks(scripts, monkeypatch):
    monkeypatch.syspath_prepend(str(scripts["pipeline_sim.py"].parent))
    sim = importlib.import_module("pipeline_sim")
    crossed = {0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F1", "1B1", "1F0", "1B0"]}  # each waits for the other
    with pytest.raises(sim.ScheduleError, match="^deadlock: rank 0 waits at 0B0 for 1B0 .or 1I0. of rank 1; "
                                                "rank 1 waits at 1F1 for 0F1 of rank 0$"):
        sim.simulate(crossed, {"F": 1, "B": 1}, 2, 2)
    result = sim.simulate({0: ["0F0", "0I0", "0W0"], 1: ["1F0", "1I0", "1W0"]}, {"F": 1, "I": 1, "W": 1}, 2, 1,
                          latency=0.5)
    assert result["step"] == 6 and result["peak"] == {0: 1, 1: 1}  # 0F0, message, 1F0, 1I0, message, 0I0, 0W0
