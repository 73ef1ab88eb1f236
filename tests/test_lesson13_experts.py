"""Lesson 13 (experts over all-to-all): what the notebook does not check itself.

The notebook's check cells, run by nbmake in the quick profile, assert every claim of its runs: the
mixture-of-experts layer equal to one process (outputs and the gradients of tokens, router and experts) with
its rows counted and the tokens a capacity drops, the load of its router trained on MNIST without balancing,
with a load-balancing loss and with an expert bias, and the bytes, calls and messages of the layer's forward and
backward. What is left: exercise 13a's check failing on its stub and on plausible wrong answers, every script's
flag checks (no worker started), a dispatch in which a rank receives nothing, a dispatch whose backward does
not swap its splits failing, the expert bias moving the choice and not the weights, and the load-balancing
loss's values (1 for any even load, below 1 possible, towards E without reaching it).
"""

import json

import pytest
import torch
from conftest import code_cell, refusal, run_exercise, write_scripts

from helpers.exercises import ExerciseFailed, replace_solution, stub
from helpers.runner import ScriptError, run_script

NOTEBOOK = "13_experts.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    return write_scripts(tmp_path_factory.mktemp("lesson13"), NOTEBOOK)


def cell(text):
    return code_cell(NOTEBOOK, text)


def test_exercise_13a_check_fails_on_the_stub_and_on_wrong_dispatches():
    solution, checker = cell("# Exercise 13a"), cell('check("13a"')
    assert run_exercise(solution, checker).startswith("Exercise 13a: ")
    with pytest.raises(ExerciseFailed, match="^Exercise 13a: not written yet"):
        run_exercise(stub(solution), checker)
    modulo = replace_solution(solution, "13a", "experts // experts_per_rank", "experts % experts_per_rank")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 13a: 2 ranks x 2 experts.*splits \[\d+, \d+\], expected "
                                             r"\[\d+, \d+\] \(slots for each rank\)$"):
        run_exercise(modulo, checker)
    no_minlength = replace_solution(solution, "13a", ", minlength=world_size", "")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 13a: 4 ranks x 1 experts.*splits \[2, 1, 1\], "
                                             r"expected \[2, 1, 1, 0\]"):
        run_exercise(no_minlength, checker)
    by_rank_only = replace_solution(solution, "13a", "torch.sort(experts, stable=True)",
                                    "torch.sort(experts // experts_per_rank, stable=True)")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 13a: .*position \d+ of the order sends slot \d+ "
                                             r"\(expert \d\) .*not grouped by expert in order$"):
        run_exercise(by_rank_only, checker)


@pytest.mark.parametrize("script, flags, message", [
    ("experts_proof.py", ["--world-size", 3, "--experts", 4], "--experts 4 must be a multiple of --world-size 3"),
    ("experts_proof.py", ["--top-k", 5], "--top-k 5 is more than the 4 experts"),
    ("experts_proof.py", ["--capacity-factor", 0], "--capacity-factor: must be a finite number > 0, got 0"),
    ("experts_balance.py", ["--world-size", 3], "--experts 4 must be a multiple of --world-size 3"),
    ("experts_balance.py", ["--batch-size", 127], "--batch-size 127 must be a multiple of --world-size 2"),
    ("experts_balance.py", ["--balance-weight", 0], "--balance-weight: must be a finite number > 0, got 0"),
    ("experts_balance.py", ["--bias-rate", 0], "--bias-rate: must be a finite number > 0, got 0"),
    ("experts_costs.py", ["--world-size", 3], "--experts 8 must be a multiple of --world-size 3"),
], ids=["proof-experts", "proof-top-k", "proof-capacity", "balance-experts", "balance-batch", "balance-weight",
        "balance-bias-rate", "costs-world"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, script, flags, message):
    """The flag checks, run in this process: a refusal exits with 2 before launch() is reached."""
    assert message in refusal(scripts[script], *flags, cwd=scripts[script].parent)


def test_dispatch_with_empty_splits_still_equals_one_process(scripts, tmp_path):
    """One token per rank and two experts: every rank sends nothing to one rank, and still matches one process."""
    run_script(scripts["experts_proof.py"], "--world-size", 2, "--experts", 2, "--tokens", 1, "--top-k", 1,
               "--run-dir", tmp_path, cwd=scripts["experts_proof.py"].parent, timeout=120, echo=False)
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


def test_balance_loss_is_one_for_any_even_load_and_can_dip_below_one(balance_loss):
    even = torch.eye(4).repeat(8, 1)  # 32 tokens, 8 sure of each expert
    unsure = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.5, 0.2, 0.2], [0.2, 0.2, 0.35, 0.25], [0.3, 0.1, 0.2, 0.4]])
    assert balance_loss(even).item() == pytest.approx(1.0)
    assert balance_loss(unsure.repeat(8, 1)).item() == pytest.approx(1.0)  # even choices, any probabilities
    # E = 2, uneven: two tokens barely choose expert 0, one is sure of expert 1
    leaning = torch.tensor([[0.51, 0.49], [0.51, 0.49], [0.01, 0.99]])
    value = balance_loss(leaning).item()
    assert value == pytest.approx(2 * (2 / 3 * 1.03 / 3 + 1 / 3 * 1.97 / 3)) and value < 1


def test_balance_loss_nears_the_expert_count_without_reaching_it_as_one_expert_takes_all(balance_loss):
    values = []
    for margin in (1.0, 4.0, 16.0):  # every token prefers expert 2, more and more surely
        logits = torch.zeros(32, 4, dtype=torch.float64).index_fill(1, torch.tensor([2]), margin)
        values.append(balance_loss(logits.softmax(1)).item())
    assert values == sorted(values) and values[-1] < 4 and values[-1] == pytest.approx(4, abs=1e-5), values


def test_expert_bias_moves_the_choice_and_not_the_weights(scripts, monkeypatch):
    monkeypatch.syspath_prepend(str(scripts["experts_moe.py"].parent))
    from experts_moe import route

    router = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    probs = router(x).softmax(-1)
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])  # far larger than any probability: every token picks expert 2
    weights, experts = route(router, x, 1, bias)
    assert (experts == 2).all()
    assert torch.equal(weights[:, 0], probs[:, 2]), "the weight is expert 2's probability, not probability + bias"


def test_dispatch_whose_backward_keeps_the_forward_splits_fails(scripts, tmp_path):
    """The gradients must take the trip back: a backward that reuses the forward's splits breaks the run."""
    layer = scripts["experts_moe.py"]
    swapped = "dist.all_to_all_single(back, grad.contiguous(), send, receive)"
    assert swapped in layer.read_text()
    folder = tmp_path / "wrong"  # the proof beside a layer whose backward keeps the forward's splits
    folder.mkdir()
    (folder / "experts_moe.py").write_text(layer.read_text().replace(
        swapped, "dist.all_to_all_single(back, grad.contiguous(), receive, send)"))
    (folder / "experts_proof.py").write_text(scripts["experts_proof.py"].read_text())
    with pytest.raises(ScriptError, match="Split sizes"):
        run_script(folder / "experts_proof.py", "--world-size", 2, "--top-k", 1, "--run-dir", tmp_path / "run",
                   cwd=folder, timeout=120, echo=False)


def test_balance_loss_gradient_lowers_the_busiest_experts_probability(balance_loss):
    logits = torch.randn(32, 4, generator=torch.Generator().manual_seed(0)).requires_grad_()
    probs = logits.softmax(1)
    balance_loss(probs).backward()
    busiest = torch.bincount(probs.argmax(1), minlength=4).argmax()
    assert (logits.grad[:, busiest] > 0).all(), "a descent step lowers every token's logit for the busiest expert"
