"""Lesson 16 (healing without a restart, and training over slow links): what the notebook's run does not cover.

The notebook's check cells assert the lesson's claims on its own runs of lesson 09's restart, reconfigure.py
(PyTorch's in-place reconfiguration), ft_heal.py (torchft), diloco.py (the sweep and the H = 1 proof) and
diloco_check.py; these tests add exercise 16a's check on its stub and on three wrong answers, a torchft run with
nobody killed, and the scripts' refusals of bad flags.
"""

import pytest
from conftest import refusal

from helpers.exercises import ExerciseFailed, check_script, replace_solution, stub
from helpers.metrics import read_metrics
from helpers.runner import run_script

NOTEBOOK = "16_healing_and_slow_links.ipynb"


@pytest.fixture
def scripts(lesson_scripts):
    lesson_scripts("02_ddp.ipynb")  # ft_heal.py imports lesson 02's ConvNet
    return lesson_scripts(NOTEBOOK)


def check_with(scripts, source):
    """Exercise 16a's check with `source` as diloco.py (which diloco_check.py imports): its verdict line."""
    scripts["diloco.py"].write_text(source)
    return check_script("16a", scripts["diloco_check.py"], "--world-size", 2, timeout=180, echo=False)


def test_exercise_16a_check_passes_the_solution_and_fails_the_stub_and_three_wrong_answers(scripts):
    source = scripts["diloco.py"].read_text()
    assert check_with(scripts, source).startswith("Exercise 16a: DiLoCo with H=1 equals DDP")
    with pytest.raises(ExerciseFailed, match="^Exercise 16a: not written yet"):
        check_with(scripts, stub(source))
    wrong_sign = replace_solution(source, "16a", "delta = g - p.detach()", "delta = p.detach() - g")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 16a: rank \d, the proof \(H=1, outer SGD lr 1, no momentum\)"):
        check_with(scripts, wrong_sign)
    averaged_weights = replace_solution(source, "16a", new="""
        for p, g in zip(model.parameters(), global_params, strict=True):
            dist.all_reduce(p.data)  # the weights averaged, as Local SGD does,
            p.data /= world_size
            g.grad = g - p.detach()
            g.copy_(p.detach())  # taken as the new global weights,
        outer_optimizer.step()  # and then the momentum step applied on top of them
        with torch.no_grad():
            for p, g in zip(model.parameters(), global_params, strict=True):
                p.copy_(g)
        """)
    with pytest.raises(ExerciseFailed, match=r"^Exercise 16a: rank \d, the proof .* element \["):
        check_with(scripts, averaged_weights)
    no_reset = replace_solution(source, "16a", "            p.copy_(g)  # every replica starts its next inner steps "
                                               "from the new global weights\n", "            pass\n")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 16a: rank \d, (the proof|outer step \d:)"):
        check_with(scripts, no_reset)


def test_torchft_replicas_without_a_kill_share_every_step_and_end_equal(scripts, tmp_path):
    out = run_script(scripts["ft_heal.py"], "--replicas", 2, "--min-replicas", 2, "--steps", 6, "--kill-at-step", 0,
                     "--run-dir", tmp_path, timeout=180, echo=False).output
    assert "all replicas finished" in out
    records = [r for r in read_metrics(tmp_path) if "committed" in r]
    assert all(r["committed"] and r["quorum"] == 2 for r in records)
    by_step = {}
    for r in records:
        by_step.setdefault(r["step"], set()).add(r["checksum"])
    assert sorted(by_step) == list(range(1, 7)) and all(len(c) == 1 for c in by_step.values())


@pytest.mark.parametrize("script, flags, message", [
    ("diloco.py", ["--runs", "diloco:0"], "must be an integer >= 1"),
    ("diloco.py", ["--runs", "fedavg:4"], "unknown method 'fedavg'"),
    ("diloco.py", ["--runs", "ddp:4"], "ddp exchanges every step"),
    ("diloco.py", ["--runs", "diloco:16", "--steps", 24], "must be a multiple of every H"),
    ("diloco.py", ["--world-size", 3, "--batch-size", 64], "must be a multiple of --world-size 3"),
    ("diloco_check.py", ["--steps", 3, "--sync-every", 2], "at least two outer steps"),
    ("reconfigure.py", ["--steps", 0], "--steps: must be an integer >= 1"),
    ("ft_heal.py", ["--replicas", 2, "--min-replicas", 2], "--min-replicas 2 is more than"),
    ("ft_heal.py", ["--replicas", 3, "--min-replicas", 4, "--kill-at-step", 0], "--min-replicas 4 is more than"),
    ("ft_heal.py", ["--kill-replica", 3], "--kill-replica must be below --replicas"),
    ("ft_heal.py", ["--steps", 20, "--kill-at-step", 15, "--heal-after", 10], "below --steps"),
], ids=["h-0", "unknown-method", "ddp-with-h", "steps-not-multiple", "batch-not-divisible", "check-one-round",
        "reconfigure-steps-0", "min-replicas-after-kill", "min-replicas-above-replicas", "kill-replica-missing",
        "heal-after-the-end"])
def test_bad_flags_fail_in_one_line_before_anything_starts(scripts, script, flags, message, tmp_path):
    run_dir = [] if script == "diloco_check.py" else ["--run-dir", tmp_path]
    assert message in refusal(scripts[script], *flags, *run_dir, cwd=tmp_path)
