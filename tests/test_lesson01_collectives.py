"""Lesson 01 (collectives): the exercise checks fail where they should, in one line each, the timing runs without
the ring, and the scripts refuse bad flags.

The notebook's own run passes the reference solutions through their checks on 4 ranks; here each check meets the
stub and the mistakes a learner makes, on 2 or 3 ranks, and must fail with one line that points at the mistake:
a wrong sum, the bytes, where a rank sent, a deadlock (where each rank waits), a rank's abort.
"""

import re
import time

import pytest
from conftest import refusal

from helpers.exercises import ExerciseFailed, check_script, failure_of, replace_solution, stub
from helpers.metrics import read_metrics
from helpers.runner import ScriptError, run_script

SHORT = {"COURSE_EXERCISE_TIMEOUT": "10"}  # a rank of an exercise run waits 10 s in one call here (30 by default)
HANG = {"COURSE_EXERCISE_TIMEOUT": "5"}  # for a run that hangs on purpose: every wait is the whole timeout

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


def check_ring(scripts, tmp_path, world=2, env=SHORT):
    start = time.perf_counter()
    try:
        return check_script("01a", scripts["allreduce_by_hand.py"], "--design", "ring", "--world-size", world,
                            "--numel", 4 * world, "--run-dir", tmp_path / "ring", timeout=120, echo=False, env=env)
    finally:  # printed, not asserted: the machine is shared
        print(f"01a check: {time.perf_counter() - start:.1f} s")


def rewrite(path, source):
    path.write_text(source)
    return path


def test_ring_check_fails_on_the_stub(scripts, tmp_path):
    path = scripts["allreduce_ring.py"]
    rewrite(path, stub(path.read_text()))
    with pytest.raises(ExerciseFailed, match="^Exercise 01a: not written yet"):
        check_ring(scripts, tmp_path)


@pytest.mark.parametrize("old, new", [
    (RING_REDUCE_SCATTER, RING_REDUCE_SCATTER.replace("step - 1)", "step)")),  # receives into the chunk it sent
    (RING_ALL_GATHER, ""),  # the all-gather phase left out: each rank holds one finished chunk only
], ids=["off-by-one-chunk", "no-all-gather-phase"])
def test_ring_check_names_the_rank_and_element_of_a_wrong_sum(scripts, tmp_path, old, new):
    path = scripts["allreduce_ring.py"]
    rewrite(path, replace_solution(path.read_text(), "01a", old, new))
    with pytest.raises(ExerciseFailed, match=r"^Exercise 01a: rank \d \(8 elements\) element \[\d+\]: "
                                             r"expected -?\d+, got -?\d+ \(\d+ of 8 elements differ\)$"):
        check_ring(scripts, tmp_path)


def test_ring_check_counts_the_bytes_of_an_answer_that_skips_the_ring(scripts, tmp_path):
    path = scripts["allreduce_ring.py"]
    rewrite(path, replace_solution(path.read_text(), "01a", new="dist.all_reduce(x, group=group)"))
    with pytest.raises(ExerciseFailed, match=r"^Exercise 01a: rank \d sent too few bytes: 0 in 0 messages, "
                                             r"expected 64 \(send with p2p.send or p2p.isend"):
        check_ring(scripts, tmp_path)


def test_ring_check_says_too_many_bytes(scripts, tmp_path):
    """Each step sends the whole tensor instead of one chunk (and the receiver takes it whole, adding its chunk)."""
    path = scripts["allreduce_ring.py"]
    source = replace_solution(path.read_text(), "01a", new="""
        for step in range(2 * (world - 1)):  # the ring's steps, but each sends the whole tensor
            request = p2p.isend(x, right, group)
            p2p.recv(torch.empty_like(x), left, group)
            request.wait()
        dist.all_reduce(x, group=group)""")
    rewrite(path, source)
    with pytest.raises(ExerciseFailed, match=r"^Exercise 01a: rank \d sent too many bytes: 128 in 2 messages, "
                                             r"expected 64$"):
        check_ring(scripts, tmp_path)


def test_ring_check_tells_a_ring_from_a_direct_reduce_scatter_and_all_gather(scripts, tmp_path):
    """Right sums and the ring's bytes, but every chunk goes straight to its owner: not a ring on 3 ranks."""
    path = scripts["allreduce_ring.py"]
    rewrite(path, replace_solution(path.read_text(), "01a", new="""
        incoming = [torch.empty_like(c) for c in chunks]
        for phase in ("reduce-scatter", "all-gather"):
            requests = []
            for peer in range(world):
                if peer == rank:
                    continue
                if phase == "reduce-scatter":  # my part of chunk `peer` to its owner; its part of mine to me
                    requests.append(p2p.isend(chunks[peer], peer, group))
                    requests.append(p2p.irecv(incoming[peer], peer, group))
                else:  # my finished chunk to everyone; theirs into place
                    requests.append(p2p.isend(chunks[rank], peer, group))
                    requests.append(p2p.irecv(chunks[peer], peer, group))
            for request in requests:
                request.wait()
            if phase == "reduce-scatter":
                for peer in range(world):
                    if peer != rank:
                        chunks[rank] += incoming[peer]"""))
    with pytest.raises(ExerciseFailed, match=r"^Exercise 01a: rank \d sent to ranks \[\d, \d\]: a ring sends only to "
                                             r"its right neighbour, rank \d$"):
        check_ring(scripts, tmp_path, world=3)


def test_a_deadlocking_ring_ends_in_one_line_naming_where_each_rank_waits(scripts, tmp_path):
    """Every rank receives first: none ever sends. The verdict comes at the exercise run's short timeout."""
    path = scripts["allreduce_ring.py"]
    rewrite(path, replace_solution(path.read_text(), "01a", """        request = p2p.isend(chunks[out], right, group)
        p2p.recv(incoming[:len(chunks[into])], left, group)
        request.wait()
""", """        p2p.recv(incoming[:len(chunks[into])], left, group)
        p2p.send(chunks[out], right, group)
"""))
    with pytest.raises(ExerciseFailed) as failed:
        check_ring(scripts, tmp_path, env=HANG)
    line = str(failed.value)
    print(line)
    assert re.fullmatch(r"Exercise 01a: deadlock, no rank went on after 5 s: ranks 0 and 1 both wait in "
                        r"`p2p\.recv\(incoming\[:len\(chunks\[into\]\)\], left, group\)` \(allreduce_ring\.py "
                        r"line \d+\)\. Hint: every rank waits to receive before any rank has sent: .*", line), line


def test_a_ring_that_breaks_when_n_does_not_divide_the_size_ends_in_one_line(scripts, tmp_path):
    """The receive buffer is sized from the last (shortest) chunk: with 9 elements on 2 ranks rank 1 receives 5
    elements into 4, and gloo aborts the process."""
    path = scripts["allreduce_ring.py"]
    rewrite(path, replace_solution(path.read_text(), "01a", "incoming = torch.empty_like(chunks[0])",
                                   "incoming = torch.empty_like(chunks[-1])"))
    with pytest.raises(ExerciseFailed) as failed:
        check_ring(scripts, tmp_path)
    line = str(failed.value)
    print(line)
    assert re.fullmatch(r"Exercise 01a: rank \d died \(signal SIGABRT, exit code -6\): .*40 vs 32.*Hint: a recv into a "
                        r"tensor smaller than the message sent \(gloo aborts\).*", line), line


def test_a_ring_that_crashes_when_n_does_not_divide_the_size_names_the_rank_and_error(scripts, tmp_path):
    path = scripts["allreduce_ring.py"]
    rewrite(path, replace_solution(path.read_text(), "01a", "chunks[into] += incoming[:len(chunks[into])]",
                                   "chunks[into] += incoming"))
    with pytest.raises(ExerciseFailed) as failed:
        check_ring(scripts, tmp_path)
    line = str(failed.value)
    print(line)
    assert re.fullmatch(r"Exercise 01a: rank \d crashed at `chunks\[into\] \+= incoming` \(allreduce_ring\.py line "
                        r"\d+\): RuntimeError: The size of tensor a \(4\) must match the size of tensor b \(5\).*",
                        line), line


def test_the_naive_design_runs_whatever_the_ring_script_holds(scripts, tmp_path):
    rewrite(scripts["allreduce_ring.py"], "def ring_all_reduce(x, group=None:\n")  # a syntax error
    run = run_script(scripts["allreduce_by_hand.py"], "--design", "naive", "--world-size", 2, "--numel", 8,
                     "--run-dir", tmp_path / "naive", echo=False, timeout=120)
    assert "[rank 0] naive: equal to dist.all_reduce on 2 ranks for 8 and 9 elements" in run.output
    problem = failure_of("01a", scripts["allreduce_by_hand.py"], "--design", "ring", "--world-size", 2, "--numel", 8,
                         "--run-dir", tmp_path / "ring", timeout=120)
    assert re.fullmatch(r"Exercise 01a: the script failed: allreduce_by_hand\.py failed with exit code 1: "
                        r"SyntaxError: .*", problem), problem


def check_all_gather(script, env=SHORT):
    return check_script("01b", script, "--world-size", 2, "--numel", 5, timeout=120, echo=False, env=env)


@pytest.mark.parametrize("old, new, message", [
    (None, None, "^Exercise 01b: not written yet"),
    ("    gathered[rank].copy_(x)\n", "", r"^Exercise 01b: rank (\d), slot \1, element \[0\]: expected \d+, got 0 "),
    (None, """    gathered[rank].copy_(x)
    dist.all_gather(gathered, x)
""", r"^Exercise 01b: rank \d sent too few bytes: 0 in 0 messages, expected \(N-1\)·S = 40 \(send with p2p"),
    (None, """    gathered[rank].copy_(x)
    requests = [p2p.isend(x, peer, group) for peer in range(world) if peer != rank for _ in range(2)]  # twice
    for peer in range(world):
        if peer != rank:
            p2p.recv(gathered[peer], peer, group)
            p2p.recv(gathered[peer], peer, group)
    for request in requests:
        request.wait()
""", r"^Exercise 01b: rank \d sent too many bytes: 80 in 2 messages, expected \(N-1\)·S = 40$"),
], ids=["stub", "own-slot-skipped", "collective-not-p2p", "twice"])
def test_all_gather_check_fails_on_the_stub_and_wrong_answers(scripts, old, new, message):
    path = scripts["allgather_by_hand.py"]
    source = path.read_text()
    if old is None:
        rewrite(path, stub(source) if new is None else replace_solution(source, "01b", new=new))
    else:
        rewrite(path, replace_solution(source, "01b", old, new))
    with pytest.raises(ExerciseFailed, match=message):
        check_all_gather(path)


def test_an_all_gather_that_sends_to_every_peer_before_receiving_ends_in_one_line(scripts):
    """On gloo a blocking send waits for its receiver: every rank sending first is a deadlock."""
    path = scripts["allgather_by_hand.py"]
    rewrite(path, replace_solution(path.read_text(), "01b", new="""
        gathered[rank].copy_(x)
        for peer in range(world):
            if peer != rank:
                p2p.send(x, peer, group)
        for peer in range(world):
            if peer != rank:
                p2p.recv(gathered[peer], peer, group)"""))
    start = time.perf_counter()
    with pytest.raises(ExerciseFailed) as failed:
        check_all_gather(path, env=HANG)
    line = str(failed.value)
    print(f"{time.perf_counter() - start:.1f} s: {line}")
    assert re.fullmatch(r"Exercise 01b: deadlock, no rank went on after 5 s: ranks 0 and 1 both wait in "
                        r"`p2p\.send\(x, peer, group\)` \(allgather_by_hand\.py line \d+\)\. Hint: on gloo a "
                        r"blocking send waits until the receiver takes the message.*", line), line


def test_timing_runs_without_the_ring_and_says_so(scripts, tmp_path):
    path = scripts["allreduce_ring.py"]
    rewrite(path, stub(path.read_text()))
    run = run_script(scripts["allreduce_timing.py"], "--world-sizes", 2, "--sizes", 64, 1024, "--repeats", 2,
                     "--run-dir", tmp_path / "timing", echo=False, timeout=120)
    assert "[rank 0] ring all-reduce not written yet: exercise 01a; timing the others" in run.output
    records = read_metrics(tmp_path / "timing")
    assert [r["bytes"] for r in records] == [64, 1024]
    for r in records:
        assert "ring seconds" not in r and r["naive seconds"] > 0 and r["gloo seconds"] > 0
        assert r["one process seconds"] > 0 and r["threads"] == 1


def test_recursive_doubling_with_a_step_left_out_fails_naming_the_rank_and_element(scripts, tmp_path):
    """The last exchange skipped: on 4 ranks each holds the sum of 2 ranks only, which the run's check catches."""
    path = scripts["allreduce_doubling.py"]
    rewrite(path, path.read_text().replace("    while bit < world:\n", "    while 2 * bit < world:\n"))
    with pytest.raises(ScriptError) as failed:
        run_script(path, "--world-sizes", 4, "--sizes", 64, "--designs", "gloo", "--repeats", 1,
                   "--run-dir", tmp_path / "doubling", echo=False, timeout=120)
    assert re.search(r"AssertionError: N=4, rank \d: doubling against dist.all_reduce, element \[\d+\]: expected "
                     r"-?\d+\.?\d*, got -?\d+", str(failed.value)), str(failed.value)


def test_recursive_doubling_runs_without_the_ring_and_counts_log2_n_messages(scripts, tmp_path):
    path = scripts["allreduce_ring.py"]
    rewrite(path, stub(path.read_text()))
    run = run_script(scripts["allreduce_doubling.py"], "--world-sizes", 2, 4, "--sizes", 64, "--repeats", 2,
                     "--run-dir", tmp_path / "doubling", echo=False, timeout=120)
    assert "[rank 0] ring all-reduce not written yet: exercise 01a; timing the others" in run.output
    records = read_metrics(tmp_path / "doubling")
    counted = {(r["world_size"], r["rank_checked"]): r for r in records if "sent_bytes" in r}
    assert sorted(counted) == [(2, 0), (2, 1), (4, 0), (4, 1), (4, 2), (4, 3)]
    assert counted[4, 1]["sent_to"] == [0, 3] and counted[4, 1]["messages"] == 2
    assert all(r["sent_bytes"] == r["messages"] * 8000 and r["checked_against"] == ["dist.all_reduce"]
               for r in counted.values())
    timed = [r for r in records if "bytes" in r]
    assert [r["world_size"] for r in timed] == [2, 4] and all("ring seconds" not in r for r in timed)
    assert all(r["doubling seconds"] > 0 and r["gloo seconds"] > 0 and r["one process seconds"] > 0 for r in timed)


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
    ("allreduce_doubling.py", ["--world-sizes", 2, 6, "--run-dir", "x"],
     "--world-sizes [6]: recursive doubling needs a power of two"),
    ("allreduce_doubling.py", ["--world-sizes", 8, "--sizes", 16, "--run-dir", "x"],
     "--sizes: each a multiple of 4 bytes, at least 32 for 8 ranks"),
], ids=["unknown-design", "world-size-1", "numel-not-divisible", "all-gather-world-size-1", "timing-world-size-1",
        "timing-size-not-float32", "timing-unknown-design", "draw-world-size-10", "pingpong-max-bytes-2",
        "doubling-world-size-6", "doubling-size-too-small"])
def test_bad_flags_fail_in_one_line_before_any_worker_starts(scripts, script, flags, message, tmp_path):
    assert message in refusal(scripts[script], *flags, cwd=tmp_path)
