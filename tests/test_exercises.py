"""The exercise format: stubs, wrong answers for tests, verdicts, and the learner notebooks."""

import json

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
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# 99 — a lesson"]}]
    cells += [{"cell_type": "code", "metadata": {}, "execution_count": 3, "outputs": [{"output_type": "stream",
               "name": "stdout", "text": ["6\n"]}], "source": s.splitlines(keepends=True)} for s in sources]
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
    assert code == [stub(CELL), "assert total([2]) == 2"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in cells if c["cell_type"] == "code")
