"""Lesson 14 (attention over a split sequence): what the notebook does not check itself.

The notebook's check cells, run by nbmake in the quick profile, assert every claim of its runs: PyTorch's CPU
flash kernel against block_attention, the all-gather attention and its gradients, the ring forward and backward
(both passes) with its two controls, the balance of contiguous against zig-zag chunks, the context-parallel
training step with its three controls, Ulysses, what each design holds and sends on its real forward and
backward, and context_parallel()'s default and its refusal of the CPU. What is left: the exercise checks
failing on their stubs and on plausible wrong answers (Ulysses' in the full profile's configuration too, and an
all-gather taken for Ulysses failing on what it sends), and every script's flag checks (no worker started).
"""


import pytest
from conftest import check_source, code_cell, refusal, run_exercise, write_scripts

from helpers.exercises import ExerciseFailed, replace_solution, stub

NOTEBOOK = "14_context.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    return write_scripts(tmp_path_factory.mktemp("lesson14"), NOTEBOOK)


def cell(text):
    return code_cell(NOTEBOOK, text)


def test_exercise_14a_check_fails_on_the_stub_and_on_merges_without_the_log_sum_exp(scripts, monkeypatch):
    monkeypatch.syspath_prepend(str(scripts["context_blocks.py"].parent))  # the check uses context_blocks
    solution, checker = cell("# Exercise 14a"), cell('check("14a"')
    assert run_exercise(solution, checker).startswith("Exercise 14a: ")
    with pytest.raises(ExerciseFailed, match="^Exercise 14a: not written yet"):
        run_exercise(stub(solution), checker)
    average = replace_solution(solution, "14a", new="return (out_a + out_b) / 2, torch.maximum(lse_a, lse_b)")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 14a: full, keys cut at 3: out element \[0, 0, \d\]: "
                                             r"expected -?[\d.e-]+, got -?[\d.e-]+ \(\d+ of 32 elements differ\)$"):
        run_exercise(average, checker)
    unnormalised = replace_solution(solution, "14a", "torch.exp(lse_a - lse)[..., None] * out_a + "
                                    "torch.exp(lse_b - lse)[..., None] * out_b",
                                    "torch.exp(lse_a)[..., None] * out_a + torch.exp(lse_b)[..., None] * out_b")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 14a: full, keys cut at 3: out element"):
        run_exercise(unnormalised, checker)


@pytest.mark.parametrize("script, flags, message", [
    ("context_ring.py", ["--world-size", 4, "--seq", 12], "--seq 12 must be a multiple of 8"),
    ("context_ring.py", ["--layouts", "diagonal"], "invalid choice: 'diagonal'"),
    ("context_allgather.py", ["--world-size", 3, "--seq", 16], "--seq 16 must be a multiple of 3"),
    ("context_cp_cpu.py", ["--world-size", 3], "--seq 16 must be a multiple of --world-size 3"),
    ("context_ulysses.py", ["--world-size", 4, "--heads", 6], "--heads 6 must be a multiple of --world-size 4"),
    ("context_ulysses.py", ["--world-size", 4, "--heads", 4], "the check needs at least 2 heads per rank (8)"),
    ("context_costs.py", ["--world-size", 3], "must be multiples of --world-size 3"),
    ("context_costs.py", ["--designs", "tree"], "invalid choice: 'tree'"),
    ("context_train.py", ["--world-size", 3, "--seq", 16], "--seq 16 must be a multiple of 6"),
], ids=["ring-seq", "ring-layout", "allgather-seq", "cp-seq", "ulysses-heads", "ulysses-one-head-per-rank",
        "costs-world", "costs-design", "train-seq"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, script, flags, message):
    """The flag checks, run in this process: a refusal exits with 2 before launch() is reached."""
    assert message in refusal(scripts[script], *flags, cwd=scripts[script].parent)


UNSWAPPED = ("arrived.transpose(0, 1).reshape(heads // world,", "arrived.reshape(heads // world,")
ALL_GATHER = '''
    def to_heads(t):  # every rank's chunk gathered, then this rank's heads kept: the right numbers
        heads, r = t.shape[0], dist.get_rank()
        whole = torch.cat([p.view(t.shape) for p in dnn.all_gather(t.flatten())], dim=1)
        return whole[r * heads // world:(r + 1) * heads // world]

    def to_sequence(t):
        seq, r = t.shape[1], dist.get_rank()
        whole = torch.cat([p.view(t.shape) for p in dnn.all_gather(t.flatten())], dim=0)
        return whole[:, r * seq // world:(r + 1) * seq // world]
'''


def test_exercise_14b_check_fails_on_the_stub_without_the_second_all_to_all_and_on_an_all_gather(scripts, tmp_path):
    solution = scripts["context_ulysses.py"].read_text()
    path = scripts["context_ulysses.py"].with_name("ulysses_attempt.py")  # beside context_blocks.py
    flags = ("--world-size", 2, "--heads", 4, "--run-dir", tmp_path)
    assert "equals full attention" in check_source("14b", path, solution, *flags, timeout=120)
    with pytest.raises(ExerciseFailed, match="^Exercise 14b: not written yet"):
        check_source("14b", path, stub(solution), *flags, timeout=120)
    # the second all-to-all missing: the rank's own heads, cut into chunks, taken for every head of its chunk
    one_way = replace_solution(solution, "14b", "exchange(t.reshape(heads, world, seq // world, dim).transpose(0, 1))",
                               "t.reshape(heads, world, seq // world, dim).transpose(0, 1)")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 14b: rank \d, full, the forward sent \{'all-to-all': \d+\} "
                                             r"bytes in \{'all-to-all': 3\} calls"):
        check_source("14b", path, one_way, *flags, timeout=120)
    # all-gathers of every head give the right numbers, and are not Ulysses: what they send gives them away
    gathered = replace_solution(solution, "14b", new=ALL_GATHER)
    with pytest.raises(ExerciseFailed, match=r"^Exercise 14b: rank \d, full, the forward sent \{'all-gather': \d+\} "
                                             r"bytes in \{'all-gather': 4\} calls, expected \{'all-to-all': \d+\}"):
        check_source("14b", path, gathered, *flags, timeout=120)


@pytest.mark.parametrize("world", [2, 4], ids=["quick-profile", "full-profile"])
def test_exercise_14b_check_fails_on_unswapped_axes_in_both_profiles_configurations(scripts, tmp_path, world):
    """The notebook runs Ulysses with 2N heads (N = 2 quick, 4 full): a source rank taken for a head must show."""
    solution = scripts["context_ulysses.py"].read_text()
    path = scripts["context_ulysses.py"].with_name(f"ulysses_unswapped_{world}.py")
    mixed = replace_solution(solution, "14b", *UNSWAPPED)
    with pytest.raises(ExerciseFailed, match=r"^Exercise 14b: rank \d, full, output element \[\d+, \d+, \d+\]: "
                                             r"expected -?[\d.e-]+, got -?[\d.e-]+ \(\d+ of \d+ elements differ\)$"):
        check_source("14b", path, mixed, "--world-size", world, "--heads", 2 * world, "--run-dir", tmp_path,
                     timeout=120)
