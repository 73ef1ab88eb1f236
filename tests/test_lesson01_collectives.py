"""Lesson 01 (collectives): the exercise checks fail where they should, the timing runs without the ring, and the
scripts refuse bad flags.

The notebook's own run passes the reference solutions through their checks on 4 ranks; here each check meets the
stub and the mistakes a learner makes, on 2 or 3 ranks, and must fail with a message that points at the mistake.
"""

import pytest
from conftest import refusal

from helpers.exercises import ExerciseFailed, check_script, replace_solution, stub
from helpers.launch import run_script
from helpers.metrics import read_metrics

NOTEBOOK = "01_collectives.ipynb"
RING_REDUCE_SCATTER = "out, into = (rank - step) % world, (rank - step - 1) % world"
RING_ALL_GATHER = """    for step in range(world - 1):  # all-gather: each finished chunk travels once around the ring
        out, into = (rank + 1 - step) % world, (rank - step) % world
        request = p2p.isend(chunks[out], right, group)
        p2p.recv(chunks[into], left, group)
        request.wait()
"""


@pytest.fixture
def scripts(lesson_scripts):
    return lesson_scripts(NOTEBOOK)


def check_ring(script, tmp_path, world=2):
    return check_script("01a", script, "--design", "ring", "--world-size", world, "--numel", 4 * world,
                        "--run-dir", tmp_path / "ring", timeout=120, echo=False)


def rewrite(path, source):
    path.write_text(source)
    return path


def test_ring_check_fails_on_the_stub(scripts, tmp_path):
    path = scripts["allreduce_by_hand.py"]
    rewrite(path, stub(path.read_text()))
    with pytest.raises(ExerciseFailed, match="^Exercise 01a: not written yet"):
        check_ring(path, tmp_path)


@pytest.mark.parametrize("old, new", [
    (RING_REDUCE_SCATTER, RING_REDUCE_SCATTER.replace("step - 1)", "step)")),  # receives into the chunk it sent
    (RING_ALL_GATHER, ""),  # the all-gather phase left out: each rank holds one finished chunk only
], ids=["off-by-one-chunk", "no-all-gather-phase"])
def test_ring_check_names_the_rank_and_element_of_a_wrong_sum(scripts, tmp_path, old, new):
    path = scripts["allreduce_by_hand.py"]
    rewrite(path, replace_solution(path.read_text(), "01a", old, new))
    with pytest.raises(ExerciseFailed, match=r"^Exercise 01a: rank \d \(8 elements\) element \[\d+\]: "
                                             r"expected -?\d+, got -?\d+ \(\d+ of 8 elements differ\)$"):
        check_ring(path, tmp_path)


def test_ring_check_counts_the_bytes_of_an_answer_that_skips_the_ring(scripts, tmp_path):
    path = scripts["allreduce_by_hand.py"]
    rewrite(path, replace_solution(path.read_text(), "01a", new="dist.all_reduce(x, group=group)"))
    with pytest.raises(ExerciseFailed, match=r"^Exercise 01a: rank \d sent 0 bytes in 0 messages, expected 64 "
                                             r"\(send with p2p.send or p2p.isend"):
        check_ring(path, tmp_path)


def check_all_gather(script):
    return check_script("01b", script, "--world-size", 2, "--numel", 5, timeout=120, echo=False)


@pytest.mark.parametrize("old, new, message", [
    (None, None, "^Exercise 01b: not written yet"),
    ("    gathered[rank].copy_(x)\n", "", r"^Exercise 01b: rank (\d), slot \1, element \[0\]: expected \d+, got 0 "),
], ids=["stub", "own-slot-skipped"])
def test_all_gather_check_fails_on_the_stub_and_wrong_answers(scripts, old, new, message):
    path = scripts["allgather_by_hand.py"]
    source = path.read_text()
    rewrite(path, stub(source) if old is None else replace_solution(source, "01b", old, new))
    with pytest.raises(ExerciseFailed, match=message):
        check_all_gather(path)


def test_timing_runs_without_the_ring_and_says_so(scripts, tmp_path):
    path = scripts["allreduce_by_hand.py"]
    rewrite(path, stub(path.read_text()))
    run = run_script(scripts["allreduce_timing.py"], "--world-sizes", 2, "--sizes", 64, 1024, "--repeats", 2,
                     "--run-dir", tmp_path / "timing", echo=False, timeout=120)
    assert "[rank 0] ring all-reduce not written yet: exercise 01a; timing the others" in run.output
    records = read_metrics(tmp_path / "timing")
    assert [r["bytes"] for r in records] == [64, 1024]
    for r in records:
        assert "ring seconds" not in r and r["naive seconds"] > 0 and r["gloo seconds"] > 0
        assert r["one process seconds"] > 0 and r["threads"] == 1


@pytest.mark.parametrize("script, flags, message", [
    ("allreduce_by_hand.py", ["--design", "tree", "--run-dir", "x"], "argument --design: invalid choice: 'tree'"),
    ("allreduce_by_hand.py", ["--design", "ring", "--world-size", 1, "--run-dir", "x"],
     "--world-size: must be an integer >= 2"),
    ("allreduce_by_hand.py", ["--design", "ring", "--numel", 1001, "--run-dir", "x"],
     "--numel 1001 is not divisible by --world-size 4"),
    ("allgather_by_hand.py", ["--world-size", 1], "--world-size: must be an integer >= 2"),
    ("allreduce_timing.py", ["--world-sizes", 2, 1, "--run-dir", "x"], "--world-sizes: must be an integer >= 2"),
    ("allreduce_timing.py", ["--sizes", 1026, "--run-dir", "x"], "--sizes [1026]: each must be a multiple of 4"),
    ("allreduce_timing.py", ["--designs", "tree", "--run-dir", "x"], "argument --designs: invalid choice: 'tree'"),
    ("collectives_drawn.py", ["--world-size", 10, "--run-dir", "x"], "--world-size: must be an integer >= 2 and <= 9"),
    ("p2p_pingpong.py", ["--max-bytes", 2, "--run-dir", "x"], "--max-bytes: must be an integer >= 4"),
], ids=["unknown-design", "world-size-1", "numel-not-divisible", "all-gather-world-size-1", "timing-world-size-1",
        "timing-size-not-float32", "timing-unknown-design", "draw-world-size-10", "pingpong-max-bytes-2"])
def test_bad_flags_fail_in_one_line_before_any_worker_starts(scripts, script, flags, message, tmp_path):
    assert message in refusal(scripts[script], *flags, cwd=tmp_path)
