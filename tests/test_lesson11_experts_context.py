"""Lesson 11 (experts over all-to-all, attention over a ring): what the notebook does not check itself.

The notebook's check cells, run by nbmake in the quick profile, assert every claim of its runs: the
mixture-of-experts layer equal to one process (outputs and gradients) with its rows counted and the tokens a
capacity drops, the load of its router trained on MNIST without and with a load-balancing loss, the
all-gather attention and its gradients, the ring causal and not with its control, the balance of contiguous
against zig-zag chunks, the K/V bytes per rank, and context_parallel() refusing the CPU.
What is left: both exercise checks failing on their stubs and on plausible wrong answers (in this process),
every script's flag checks (no worker started), a dispatch in which a rank receives nothing, and the
load-balancing loss's two ends (1 for an even load, E when one expert takes every token).
"""

import json

import pytest
import torch
from conftest import NOTEBOOKS, refusal, write_scripts

from helpers.exercises import ExerciseFailed, replace_solution, stub
from helpers.launch import run_script

NOTEBOOK = "11_experts_context.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    return write_scripts(tmp_path_factory.mktemp("lesson11"), NOTEBOOK)


def cell(text):
    """The source of the lesson's code cell that contains ``text``."""
    sources = ["".join(c["source"]) for c in json.loads((NOTEBOOKS / NOTEBOOK).read_text())["cells"]
               if c["cell_type"] == "code"]
    (found,) = [s for s in sources if text in s]
    return found


def run_exercise(exercise_cell, check_cell):
    """Run an exercise cell, then its check cell, as the notebook would; return the verdict line."""
    space = {}
    exec("import torch\nfrom helpers.exercises import check, first_difference", space)
    exec(exercise_cell, space)
    exec(check_cell.rstrip().rstrip(";").replace("check(", "verdict = check(", 1), space)
    return space["verdict"]


def test_exercise_11a_check_fails_on_the_stub_and_on_wrong_dispatches():
    solution, checker = cell("# Exercise 11a"), cell('check("11a"')
    assert run_exercise(solution, checker).startswith("Exercise 11a: ")
    with pytest.raises(ExerciseFailed, match="^Exercise 11a: not written yet"):
        run_exercise(stub(solution), checker)
    modulo = replace_solution(solution, "11a", "experts // experts_per_rank", "experts % experts_per_rank")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 11a: 2 ranks x 2 experts.*splits \[\d+, \d+\], expected "
                                             r"\[\d+, \d+\] \(slots for each rank\)$"):
        run_exercise(modulo, checker)
    no_minlength = replace_solution(solution, "11a", ", minlength=world_size", "")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 11a: 4 ranks x 1 experts.*splits \[2, 1, 1\], "
                                             r"expected \[2, 1, 1, 0\]"):
        run_exercise(no_minlength, checker)
    by_rank_only = replace_solution(solution, "11a", "torch.sort(experts, stable=True)",
                                    "torch.sort(experts // experts_per_rank, stable=True)")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 11a: .*position \d+ of the order sends slot \d+ "
                                             r"\(expert \d\) .*not grouped by expert in order$"):
        run_exercise(by_rank_only, checker)


def test_exercise_11b_check_fails_on_the_stub_and_on_merges_without_the_log_sum_exp(scripts, monkeypatch):
    monkeypatch.syspath_prepend(str(scripts["context_blocks.py"].parent))  # the check uses context_blocks
    solution, checker = cell("# Exercise 11b"), cell('check("11b"')
    assert run_exercise(solution, checker).startswith("Exercise 11b: ")
    with pytest.raises(ExerciseFailed, match="^Exercise 11b: not written yet"):
        run_exercise(stub(solution), checker)
    average = replace_solution(solution, "11b", new="return (out_a + out_b) / 2, torch.maximum(lse_a, lse_b)")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 11b: full, keys cut at 3: out element \[0, 0, \d\]: "
                                             r"expected -?[\d.e-]+, got -?[\d.e-]+ \(\d+ of 32 elements differ\)$"):
        run_exercise(average, checker)
    unnormalised = replace_solution(solution, "11b", "torch.exp(lse_a - lse)[..., None] * out_a + "
                                    "torch.exp(lse_b - lse)[..., None] * out_b",
                                    "torch.exp(lse_a)[..., None] * out_a + torch.exp(lse_b)[..., None] * out_b")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 11b: full, keys cut at 3: out element"):
        run_exercise(unnormalised, checker)


@pytest.mark.parametrize("script, flags, message", [
    ("experts_moe.py", ["--world-size", 3, "--experts", 4], "--experts 4 must be a multiple of --world-size 3"),
    ("experts_moe.py", ["--top-k", 5], "--top-k 5 is more than the 4 experts"),
    ("experts_moe.py", ["--capacity-factor", 0], "--capacity-factor: must be a finite number > 0, got 0"),
    ("experts_balance.py", ["--world-size", 3], "--experts 4 must be a multiple of --world-size 3"),
    ("experts_balance.py", ["--batch-size", 127], "--batch-size 127 must be a multiple of --world-size 2"),
    ("experts_balance.py", ["--balance-weight", 0], "--balance-weight: must be a finite number > 0, got 0"),
    ("context_ring.py", ["--world-size", 4, "--seq", 12], "--seq 12 must be a multiple of 8"),
    ("context_ring.py", ["--layouts", "diagonal"], "invalid choice: 'diagonal'"),
    ("context_allgather.py", ["--world-size", 3, "--seq", 16], "--seq 16 must be a multiple of 3"),
    ("context_cp_cpu.py", ["--world-size", 3], "--seq 16 must be a multiple of --world-size 3"),
], ids=["moe-experts", "moe-top-k", "moe-capacity", "balance-experts", "balance-batch", "balance-weight",
        "ring-seq", "ring-layout", "allgather-seq", "cp-seq"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, script, flags, message):
    """The flag checks, run in this process: a refusal exits with 2 before launch() is reached."""
    assert message in refusal(scripts[script], *flags, cwd=scripts[script].parent)


def test_dispatch_with_empty_splits_still_equals_one_process(scripts, tmp_path):
    """One token per rank and two experts: every rank sends nothing to one rank, and still matches one process."""
    run_script(scripts["experts_moe.py"], "--world-size", 2, "--experts", 2, "--tokens", 1, "--top-k", 1,
               "--run-dir", tmp_path, cwd=scripts["experts_moe.py"].parent, timeout=120, echo=False)
    records = [json.loads(line) for f in sorted(tmp_path.glob("rank*.jsonl")) for line in f.read_text().splitlines()]
    assert len(records) == 2 and all(0 in r["sent"] and sum(r["sent"]) == 1 for r in records), records
    assert all(max(r["out_diff"], r["router_grad_diff"], r["expert_grad_diff"]) < 1e-12 for r in records), records
    assert torch.tensor([r["received"] for r in records]).sum() == 2


@pytest.fixture
def balance_loss(scripts, monkeypatch):
    """experts_balance.py's load-balancing loss (the script imports experts_moe from its folder)."""
    monkeypatch.syspath_prepend(str(scripts["experts_balance.py"].parent))
    from experts_balance import balance_loss

    return balance_loss


def test_balance_loss_is_one_for_an_even_load_and_the_expert_count_when_one_expert_takes_all(balance_loss):
    even = torch.eye(4).repeat(8, 1)  # 32 tokens, 8 sure of each expert
    collapsed = torch.zeros(32, 4).index_fill(1, torch.tensor([2]), 1.0)  # every token sure of expert 2
    assert balance_loss(even).item() == pytest.approx(1.0)
    assert balance_loss(collapsed).item() == pytest.approx(4.0)


def test_balance_loss_gradient_lowers_the_busiest_experts_probability(balance_loss):
    logits = torch.randn(32, 4, generator=torch.Generator().manual_seed(0)).requires_grad_()
    probs = logits.softmax(1)
    balance_loss(probs).backward()
    busiest = torch.bincount(probs.argmax(1), minlength=4).argmax()
    assert (logits.grad[:, busiest] > 0).all(), "a descent step lowers every token's logit for the busiest expert"
