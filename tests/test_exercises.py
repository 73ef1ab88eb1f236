"""The exercise format: stubs, wrong answers for tests, verdicts, and the learner notebooks."""

import json
import re
import time
from pathlib import Path

import pytest
import torch

from helpers.exercises import (
    BEGIN,
    END,
    ExerciseFailed,
    check,
    check_script,
    exercises,
    first_difference,
    replace_solution,
    solution,
    stub,
    write_learner_notebooks,
)
from helpers.exercises.format import KEEP_GOING

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

CELL = f"""def total(values):
    # Exercise 99a: the sum of a list
    {BEGIN}
    result = 0
    for v in values:
        result += v
    return result
    {END}


print(total([1, 2, 3]))
"""


def test_exercises_are_named_by_the_line_above_their_markers():
    assert exercises(CELL) == [("99a", "the sum of a list")]
    with pytest.raises(ValueError, match="must be '# Exercise NNx"):
        exercises(CELL.replace("# Exercise 99a: the sum of a list", "# sum it"))
    with pytest.raises(ValueError, match="against"):
        exercises(CELL.replace(END, ""))


def test_stub_raises_not_implemented_naming_the_exercise():
    learner = stub(CELL)
    assert BEGIN not in learner and "result += v" not in learner and "print(total" in learner
    space = {}
    exec(learner.replace("print(total([1, 2, 3]))", ""), space)
    with pytest.raises(NotImplementedError, match=r"Exercise 99a \(the sum of a list\): not written yet"):
        space["total"]([1])


def test_replace_solution_puts_a_wrong_answer_in_place():
    wrong = replace_solution(CELL, "99a", "result = 0", "result = 1")
    assert "result = 1" in solution(wrong, "99a") and "print(total" in wrong
    whole = replace_solution(CELL, "99a", new="return len(values)")
    assert solution(whole, "99a") == "    return len(values)\n"
    with pytest.raises(ValueError, match="not in the solution"):
        replace_solution(CELL, "99a", "no such text", "")
    with pytest.raises(KeyError):
        replace_solution(CELL, "99b", new="pass")


def test_first_difference_names_the_element_and_both_values():
    assert first_difference(torch.arange(4.0), torch.arange(4.0)) is None
    got = torch.tensor([[0.0, 1.0], [2.0, 5.0]])
    assert first_difference(torch.tensor([[0.0, 1.0], [2.0, 3.0]]), got, "rank 1") == \
        "rank 1 element [1, 1]: expected 3, got 5 (1 of 4 elements differ)"
    assert "shape: expected (3,), got (2,)" in first_difference(torch.zeros(3), torch.zeros(2))
    assert first_difference(torch.zeros(2), torch.full((2,), 1e-9), atol=1e-6) is None


def test_check_gives_a_one_line_verdict(capsys):
    space = {}
    exec(CELL, space)
    assert check("99a", lambda: None if space["total"]([1, 2]) == 3 else "wrong sum") == "Exercise 99a: correct"
    exec(replace_solution(CELL, "99a", "result = 0", "result = 1"), space)
    with pytest.raises(ExerciseFailed, match=r"^Exercise 99a: total\(\[1, 2\]\) gave 4, expected 3$"):
        check("99a", lambda: None if space["total"]([1, 2]) == 3 else f"total([1, 2]) gave {space['total']([1, 2])}, "
                                                                         "expected 3")
    exec(stub(CELL).replace("print(total([1, 2, 3]))", ""), space)
    with pytest.raises(ExerciseFailed, match="^Exercise 99a: not written yet"):
        check("99a", lambda: space["total"]([1]))


SCRIPT = f'''"""Each rank adds up the ranks with point-to-point messages: a tiny exercise for the format's tests."""
import torch
import torch.distributed as dist

from helpers.exercises import first_difference, verdict
from helpers.launch import launch


def sum_of_ranks(rank, world):
    # Exercise 99b: every rank ends with the sum of all ranks
    {BEGIN}
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    return value
    {END}


def run(worker):
    worker.init_process_group()
    got = sum_of_ranks(worker.rank, worker.world_size)
    expected = torch.tensor([float(sum(range(worker.world_size)))])
    problem = first_difference(expected, got, f"rank {{worker.rank}}")
    dist.barrier()
    verdict("99b", problem, passed=f"rank {{worker.rank}} holds {{got.item():g}}")
    dist.destroy_process_group()


if __name__ == "__main__":
    launch(run, 2)
'''


def test_check_script_passes_the_solution_and_fails_the_stub_and_a_wrong_answer(tmp_path):
    path = tmp_path / "sum_of_ranks.py"
    path.write_text(SCRIPT)
    assert check_script("99b", path, timeout=120, echo=False).startswith("Exercise 99b: rank ")
    path.write_text(stub(SCRIPT))
    with pytest.raises(ExerciseFailed, match="^Exercise 99b: not written yet"):
        check_script("99b", path, timeout=120, echo=False)
    path.write_text(replace_solution(SCRIPT, "99b", "dist.all_reduce(value)", "pass"))
    with pytest.raises(ExerciseFailed, match=r"^Exercise 99b: rank \d element \[0\]: expected 1, got \d"):
        check_script("99b", path, timeout=120, echo=False)


def _notebook(*sources):
    cells = [{"cell_type": "markdown", "id": "title", "metadata": {}, "source": ["# 99 — a lesson"]}]
    cells += [{"cell_type": "code", "id": f"code-{i}", "metadata": {}, "execution_count": 3, "outputs": [
               {"output_type": "stream", "name": "stdout", "text": ["6\n"]}], "source": s.splitlines(keepends=True)}
              for i, s in enumerate(sources)]
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_learner_notebooks_are_written_for_lessons_with_exercises_only(tmp_path):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    (lessons / "98_none.ipynb").write_text(json.dumps(_notebook("print(1)")))
    (lessons / "99_sum.ipynb").write_text(json.dumps(_notebook(CELL, "assert total([2]) == 2")))
    written = write_learner_notebooks(tmp_path / "out", lessons)
    assert [p.name for p in written] == ["99_sum.ipynb"]
    cells = json.loads(written[0].read_text())["cells"]
    assert "exercise version" in "".join(cells[1]["source"])
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert code == [KEEP_GOING, stub(CELL), "assert total([2]) == 2",
                    "from helpers.exercises import summary\n\nsummary(['99a']);"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in cells if c["cell_type"] == "code")


def test_a_learner_version_runs_to_its_end_and_lists_its_exercises(tmp_path):
    """Executed as Run All does (nbclient, stopping at the first error): the unwritten exercise's check prints its
    verdict without stopping the run, and the last cell's table says which exercise failed."""
    import nbclient
    import nbformat

    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    check_cell = 'from helpers.exercises import check\n\ncheck("99a", lambda: None if total([1, 2]) == 3 else "wrong")'
    (lessons / "99_sum.ipynb").write_text(json.dumps(_notebook(CELL.replace("print(total([1, 2, 3]))", ""),
                                                               check_cell, "print('the last lesson cell')")))
    nb = nbformat.read(write_learner_notebooks(tmp_path / "out", lessons)[0], as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=False).execute()
    printed = ["".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert printed[-3:] == ["Exercise 99a: not written yet (its cell still raises NotImplementedError)\n",
                            "the last lesson cell\n",
                            "exercise  result   verdict\n99a       failed   Exercise 99a: not written yet (its cell "
                            "still raises NotImplementedError)\n0 of 1 passed\n"], printed


# --- every way an exercise fails ends in one line starting with its id (issue 42) -----------------------------

SHORT = {"COURSE_EXERCISE_TIMEOUT": "10"}  # a rank of an exercise run waits 10 s in one call here (30 by default)
HANG = {"COURSE_EXERCISE_TIMEOUT": "5"}  # for a run that hangs on purpose: every wait is the whole timeout


def verdict_of(exercise, path, *flags, timeout=150, env=SHORT):
    """The check's failure line, and the seconds it took (printed: this machine is shared, so never asserted)."""
    start = time.perf_counter()
    with pytest.raises(ExerciseFailed) as failed:
        check_script(exercise, path, *flags, timeout=timeout, echo=False, env=env)
    line = str(failed.value)
    print(f"{time.perf_counter() - start:.1f} s: {line}")
    assert "\n" not in line and line.startswith(f"Exercise {exercise}: "), line
    return line


def test_first_difference_counts_a_non_finite_value_as_a_difference():
    assert "element [1]: expected 1, got nan (1 of 3 elements differ)" in first_difference(
        torch.arange(3.0), torch.tensor([0.0, float("nan"), 2.0]))
    assert first_difference(torch.ones(2), torch.full((2,), float("nan")), atol=1e9) is not None
    assert "got inf" in first_difference(torch.ones(1), torch.full((1,), float("inf")))
    assert first_difference(torch.full((1,), float("inf")), torch.full((1,), float("inf"))) is None


def test_a_deadlock_ends_in_one_line_naming_where_each_rank_waits(tmp_path):
    path = tmp_path / "sum_of_ranks.py"
    path.write_text(replace_solution(SCRIPT, "99b", new="""
        value, other = torch.tensor([float(rank)]), torch.empty(1)
        dist.recv(other, (rank + 1) % world)  # every rank receives first: none ever sends
        dist.send(value, (rank + 1) % world)
        return value + other"""))
    line = verdict_of("99b", path, env=HANG)
    assert re.fullmatch(r"Exercise 99b: deadlock, no rank went on after 5 s: ranks 0 and 1 both wait in "
                        r"`dist\.recv\(other, \(rank \+ 1\) % world\)` \(sum_of_ranks\.py line 13\)\. "
                        r"Hint: every rank waits to receive before any rank has sent: .*", line), line


NO_PY_SPY = {**HANG, "COURSE_PY_SPY": ""}  # as where py-spy is not installed


def read_or_said_why(line, rank, place):
    """A rank still waiting is either placed from its py-spy dump or named as not read, with why: never dropped."""
    if f"rank {rank}: not read (" in line:
        assert f"Hint, if rank {rank} waits as " in line, line  # the hint says whose stacks it comes from
        return
    assert place in line, line


@pytest.mark.parametrize("env", [HANG, NO_PY_SPY], ids=["py-spy as found", "no py-spy"])
def test_a_rank_still_waiting_elsewhere_is_found_by_its_stack(tmp_path, env):
    """Rank 1 never reaches a torch.distributed call: its place comes from a py-spy dump of the live process;
    without py-spy the line says rank 1 could not be read, and why, and that the hint comes from rank 0."""
    path = tmp_path / "sum_of_ranks.py"
    path.write_text(replace_solution(SCRIPT, "99b", new="""
        value = torch.tensor([float(rank)])
        if rank == 0:
            dist.recv(value, 1)
        else:
            while True:
                time.sleep(0.1)
        return value""").replace("import torch\n", "import time\n\nimport torch\n", 1))
    line = verdict_of("99b", path, env=env)
    assert "rank 0 waits in `dist.recv(value, 1)` (sum_of_ranks.py line 16)" in line, line
    if env is NO_PY_SPY:
        assert ("rank 1: not read (py-spy is not installed (pip install py-spy)). "
                "Hint, if rank 1 waits as rank 0 does: ") in line, line
    read_or_said_why(line, 1, "rank 1 waits in `time.sleep(0.1)` (sum_of_ranks.py line 19)")


def test_a_crash_in_a_worker_names_the_rank_the_line_and_the_error(tmp_path):
    path = tmp_path / "sum_of_ranks.py"
    path.write_text(replace_solution(SCRIPT, "99b", "dist.all_reduce(value)", "value += torch.ones(rank + 1)"))
    line = verdict_of("99b", path)
    assert re.fullmatch(r"Exercise 99b: rank 1 crashed at `value \+= torch\.ones\(rank \+ 1\)` \(sum_of_ranks\.py "
                        r"line 13\): RuntimeError: output with shape \[1\] doesn't match the broadcast shape \[2\]",
                        line), line


RPC_SCRIPT = f'''"""An RPC exercise for the format's tests: rank 0 asks rank 1."""
import time

import torch
from torch.distributed import rpc

from helpers.exercises import verdict
from helpers.launch import launch


def served(x):
    return x + 1


def run(worker):
    worker.init_rpc()
    if worker.rank == 0:
        # Exercise 99c: one call to rank 1
        {BEGIN}
        got = rpc.rpc_sync("worker1", served, args=(torch.ones(1),))
        {END}
        verdict("99c", None if got.item() == 2 else f"got {{got.item()}}, expected 2")
    rpc.shutdown()


if __name__ == "__main__":
    launch(run, 2)
'''


@pytest.mark.parametrize("env", [HANG, NO_PY_SPY], ids=["py-spy as found", "no py-spy"])
def test_a_stalled_rpc_ends_in_one_line_within_the_rpc_timeout(tmp_path, env):
    path = tmp_path / "ask.py"
    path.write_text(RPC_SCRIPT)
    if env is HANG:  # the right answer passes (once is enough)
        assert check_script("99c", path, timeout=150, echo=False, env=SHORT) == "Exercise 99c: correct"
    path.write_text(RPC_SCRIPT.replace("    return x + 1", "    time.sleep(600)  # never answers in time"))
    line = verdict_of("99c", path, env=env)
    assert line.startswith("Exercise 99c: an RPC did not return after 5 s: rank 0 waits in "
                           "`got = rpc.rpc_sync(\"worker1\", served, args=(torch.ones(1),))` (ask.py line 20)"), line
    if env is NO_PY_SPY:
        assert "rank 1: not read (py-spy is not installed (pip install py-spy))" in line, line
    read_or_said_why(line, 1, "rank 1 waits in `time.sleep(600)` (ask.py line 12)")


@pytest.mark.parametrize("exercise, notebook, script, old, new", [
    ("09a", "09_scaling_faults.ipynb", "resumable.py", "torch.save(state, f)",
     'torch.save({**state, "model": {k: v * float("nan") for k, v in state["model"].items()}}, f)'),
    ("10a", "10_sharding.ipynb", "zero2_train.py", "shard.grad /= world", 'shard.grad *= float("nan")'),
    ("12a", "12_one_step.ipynb", "step_accumulate.py", "yi.flatten()) / k", 'yi.flatten()) * float("nan")'),
], ids=["09a", "10a", "12a"])
def test_a_nan_answer_fails_its_check(tmp_path, monkeypatch, exercise, notebook, script, old, new):
    from conftest import write_scripts

    monkeypatch.setenv("COURSE_RUNS", str(tmp_path / "runs"))
    flags = {"09a": ["--check", "--steps", 30, "--checkpoint-every", 5, "--kill-in-save", 20],
             "10a": ["--world-size", 2, "--steps", 2, "--dim", 32, "--hidden", 64, "--blocks", 2, "--seq-len", 16],
             "12a": ["--world-size", 2, "--steps", 2, "--micro-steps", 2, "--batch-size", 8, "--dim", 32,
                     "--hidden", 64]}[exercise]
    path = write_scripts(tmp_path, notebook)[script]
    path.write_text(replace_solution(path.read_text(), exercise, old, new))
    line = verdict_of(exercise, path, *flags, "--run-dir", tmp_path / "run")
    assert re.search(r"element \[[\d, ]*\]: expected -?[\d.e+-]+, got nan", line), line


LOCK_TWICE = """
import threading
import sys

from helpers.exercises import check


class Counter:
    def __init__(self):
        self.lock, self.value = threading.Lock(), 0

    def read(self):
        with self.lock:
            return self.value

    def add(self):
        with self.lock:
            self.value = self.read() + 1  # read() takes the lock this thread holds: it waits for itself


def problem():
    counter = Counter()
    threads = [threading.Thread(target=counter.add, name=f"adder-{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return None if counter.value == 2 else f"value {counter.value}"


print(check("99d", problem, timeout=3))
"""


def run_cell(source, tmp_path, env=None):
    """Run ``source`` as a notebook cell would (its lines known to linecache), in a process of its own that leaves
    at once after it, however many of its threads still wait; its output and the seconds it took."""
    import os
    import subprocess
    import sys

    program = ("import linecache, os, sys\nsource = open(sys.argv[1]).read()\n"
               "linecache.cache['<cell-1>'] = (len(source), None, source.splitlines(True), '<cell-1>')\n"
               "from helpers.exercises import keep_going\nkeep_going()\n"
               "exec(compile(source, '<cell-1>', 'exec'), {'__name__': '__main__'})\nsys.stdout.flush()\n"
               "os._exit(0)\n")
    (tmp_path / "cell.py").write_text(source)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path / "cell.py")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done.stdout, time.perf_counter() - start


def test_an_in_notebook_check_is_bounded_and_names_the_threads_that_did_not_finish(tmp_path):
    out, seconds = run_cell(LOCK_TWICE, tmp_path)
    line = out.strip().splitlines()[0]
    print(f"{seconds:.1f} s: {line}")
    assert line.startswith("Exercise 99d: did not finish within 3 s: thread adder-"), line  # which one: by chance
    assert re.search(r"thread adder-(\d) waits in `with self\.lock:` \(`read`, line 13 of its cell, called from "
                     r"`add`\); thread adder-(?!\1)\d waits in `with self\.lock:` \(`add`, line 17 of its cell\)\. "
                     r"Likely cause: `add` holds self\.lock and calls `read`, which takes it again", line), line


def test_06a_update_taking_its_lock_twice_ends_in_one_line(tmp_path):
    """Lesson 07's own check, unchanged, on an update() that calls read() inside `with self.lock:`."""
    cells = [c for c in json.loads((NOTEBOOKS / "07_parameter_server.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    store = next("".join(c["source"]) for c in cells if "class VersionedWeights" in "".join(c["source"]))
    proof = next("".join(c["source"]) for c in cells if "def versioned_update_problem" in "".join(c["source"]))
    checked = next("".join(c["source"]) for c in cells if 'check("07a"' in "".join(c["source"]))
    wrong = replace_solution(store, "07a", "staleness = self.version - version", "staleness = self.read()[0] - version")
    out, seconds = run_cell("import torch\n" + "\n".join([wrong, proof, checked]), tmp_path,
                            env={"COURSE_EXERCISE_TIMEOUT": "5"})
    line = out.strip().splitlines()[-1]
    print(f"{seconds:.1f} s: {line}")
    assert line.startswith("Exercise 07a: did not finish within 5 s: "), line  # which thread waits where: by chance
    assert "thread Thread-1 (trainer) waits in `with self.lock:` (`read`, line 17 of its cell, called from `update`)" \
        in line.replace("Thread-2", "Thread-1").replace("Thread-3", "Thread-1").replace("Thread-4", "Thread-1"), line
    assert line.endswith(". Likely cause: `update` holds self.lock and calls `read`, which takes it again: a "
                         "threading.Lock is not re-entrant, so the thread waits for itself (take the lock once, and "
                         "do what `read` does inside it without calling it)"), line


def test_a_check_that_raises_and_keep_going_give_one_line_each(capsys):
    def broken():
        return [1, 2][5]

    with pytest.raises(ExerciseFailed, match=r"^Exercise 99e: your code raised at `return \[1, 2\]\[5\]` "
                                             r"\(test_exercises\.py line \d+\): IndexError: list index out of range$"):
        check("99e", broken)
    from helpers import exercises

    exercises.keep_going()
    try:
        assert check("99f", lambda: "wrong") == "Exercise 99f: wrong"
        assert check("99g", lambda: None) == "Exercise 99g: correct"
        table = exercises.summary(["99f", "99g", "99h"])
    finally:
        exercises.keep_going(False)
    assert table.splitlines()[1:] == ["99f       failed   Exercise 99f: wrong",
                                      "99g       passed   Exercise 99g: correct", "99h       not run", "1 of 3 passed"]


def test_nbgrader_gives_full_marks_to_the_solutions_zero_to_the_release_and_to_one_wrong_answer_alone(
        tmp_path, request):
    """Real nbgrader on the course directory `python -m helpers.exercises --nbgrader` writes (the cells the checks
    need, so that autograding takes seconds): generate_assignment of lessons 01 and 10, then autograde of the
    reference solutions, of the release version, and of lesson 01 with exercise 01a wrong. One process runs every
    step through nbgrader's own API (``NbGraderAPI``, what its command line and formgrader call), with the
    course's ``nbgrader_config.py``: each ``nbgrader`` command would import nbgrader again. Its kernels are the
    run's other lesson kernels (forked from the warm starter, tests/conftest.py), where the run has them."""
    import os
    import shutil
    import subprocess
    import sys

    from nbgrader.api import Gradebook

    from helpers.exercises.__main__ import main

    start = time.perf_counter()
    kernel = getattr(request.config.option, "nbmake_kernel", None) or ""  # tests/conftest.py: its warm kernel
    course = tmp_path / "course"
    lessons = {"01_collectives": ["01a", "01b"], "10_sharding": ["10a"]}
    assert main(["--nbgrader", str(course), "--lessons", "01", "10", "--checks-only"]) == 0
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COURSE_RUNS": str(tmp_path / "runs"), **SHORT}

    def nbgrader(*steps):
        """Run (method, *args) steps of NbGraderAPI in one process in the course directory; each must succeed."""
        code = ("import json, sys\nfrom nbgrader.apps import NbGrader, NbGraderAPI\n"
                "app = NbGrader()\napp.load_config_file()  # nbgrader_config.py, as the command line reads it\n"
                "if sys.argv[2]:  # the kernel the run's notebooks use\n"
                "    app.config.Execute.kernel_name = sys.argv[2]\n"
                "api = NbGraderAPI(config=app.config)\n"
                "for method, *args in json.loads(sys.argv[1]):\n"
                "    result = getattr(api, method)(*args, force=True, create=True)\n"
                "    assert result['success'], (method, args, result.get('log'), result.get('error'))\n")
        done = subprocess.run([sys.executable, "-c", code, json.dumps(steps), kernel], cwd=course, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def submit(student, lesson, text):
        folder = course / "submitted" / student / lesson
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{lesson}.ipynb").write_text(text)

    nbgrader(*[("generate_assignment", lesson) for lesson in lessons])
    release = (course / "release" / "01_collectives" / "01_collectives.ipynb").read_text()
    assert "### BEGIN SOLUTION" not in release and "YOUR CODE HERE" in release
    for lesson in lessons:
        submit("solutions", lesson, (course / "source" / lesson / f"{lesson}.ipynb").read_text())
        submit("release", lesson, (course / "release" / lesson / f"{lesson}.ipynb").read_text())
    source = json.loads((course / "source" / "01_collectives" / "01_collectives.ipynb").read_text())
    for cell in source["cells"]:
        if cell["cell_type"] == "code" and ("01a", ) == tuple(e for e, _ in exercises("".join(cell["source"]))):
            wrong = replace_solution("".join(cell["source"]), "01a", "(rank - step - 1) % world",
                                     "(rank - step) % world")  # receives into the chunk it sent
            cell["source"] = wrong.splitlines(keepends=True)
    submit("wrong-01a", "01_collectives", json.dumps(source))
    students = {lesson: [p.name for p in sorted((course / "submitted").iterdir()) if (p / lesson).is_dir()]
                for lesson in lessons}
    nbgrader(*[("autograde", lesson, student) for lesson in lessons for student in students[lesson]])
    scores = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as book:
        for lesson, ids in lessons.items():
            for student in ("solutions", "release", "wrong-01a"):
                if student == "wrong-01a" and lesson != "01_collectives":
                    continue
                for exercise in ids:
                    grade = book.find_grade(f"{exercise}-check", lesson, lesson, student)
                    scores[student, exercise] = (grade.score, grade.max_score)
    print(f"nbgrader: {time.perf_counter() - start:.0f} s; {scores}")
    assert all(scores["solutions", e] == (1, 1) for ids in lessons.values() for e in ids), scores
    assert all(scores["release", e] == (0, 1) for ids in lessons.values() for e in ids), scores
    assert scores["wrong-01a", "01a"] == (0, 1) and scores["wrong-01a", "01b"] == (1, 1), scores
    shutil.rmtree(course / "autograded", ignore_errors=True)


def test_a_page_shows_one_box_per_stream_one_verdict_per_check_and_says_the_whole_script_is_folded():
    import nbformat

    from helpers.site import fold_solutions, tidy_outputs

    script = f"%%writefile scripts/ring.py\n# Exercise 99a: a ring\n{BEGIN}\npass\n{END}\n"
    check_cell = nbformat.v4.new_code_cell('check_script("99a", "scripts/ring.py")', outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="[rank 0] one\n"),
        nbformat.v4.new_output("stream", name="stdout", text="[rank 1] two\n"),
        nbformat.v4.new_output("stream", name="stdout", text="Exercise 99a: correct\n"),
        nbformat.v4.new_output("execute_result", data={"text/plain": "'Exercise 99a: correct'"}, execution_count=1)])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(script), check_cell])
    assert fold_solutions(nb) == ["99a"]
    assert nb.cells[0].metadata["mystnb"]["code_prompt_show"] == "Show the whole script ring.py, with the solution " \
                                                                 "of exercise 99a"
    tidy_outputs(nb)
    assert [(o.output_type, o.get("text")) for o in nb.cells[1].outputs] == \
        [("stream", "[rank 0] one\n[rank 1] two\nExercise 99a: correct\n")]
