"""Lesson 12 (choosing a layout): what the notebook does not check itself.

The notebook's check cells, run by nbmake in the quick profile, assert every term of the model against the
course's own runs: bytes held by kind, bytes and calls of every collective, FLOPs against FlopCounterMode, and
the memory at 64 ranks against FSDPMemTracker. What is left: that those checks can fail, each when one term of
the model is wrong (Adam without its second moment, ZeRO-2 without its whole gradient during backward, FSDP2
gathering each block once, the MLP's hidden activation saved once, backward priced as one forward), both
exercise checks failing on their stubs and on plausible wrong answers, and
the scripts' flag checks (no worker started).
"""

import importlib.util
import json
import sys

import pytest
from conftest import NOTEBOOKS, refusal, write_scripts

from helpers.exercises import ExerciseFailed, replace_solution, stub
from helpers.launch import run_script
from helpers.metrics import read_metrics

NOTEBOOK = "12_choosing_a_layout.ipynb"
SMALL = dict(vocab=64, seq=16, dim=32, heads=4, hidden=64, blocks=2)
BATCH = 16


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson12")
    return write_scripts(folder, "09_sharding.ipynb", NOTEBOOK)


@pytest.fixture(scope="module")
def measured(scripts, tmp_path_factory):
    """DDP, ZeRO-1, ZeRO-2 and FSDP2 of a small model on 2 ranks, measured by layout_measure.py: {mode: record}."""
    folder = tmp_path_factory.mktemp("lesson12_runs")
    run_script(scripts["layout_measure.py"], "--world-size", 2, "--modes", "ddp", "zero1", "zero2", "fsdp",
               "--steps", 4, "--batch-size", BATCH, "--dim", SMALL["dim"], "--hidden", SMALL["hidden"],
               "--blocks", SMALL["blocks"], "--seq-len", SMALL["seq"], "--run-dir", folder, timeout=300, echo=False)
    return {r["mode"]: r for r in read_metrics(folder) if "per_rank" in r}


def load_model(scripts, old=None, new=None):
    """layout_model.py as a module, with `old` replaced by `new` in its source (one term made wrong)."""
    source = scripts["layout_model.py"].read_text()
    if old is not None:
        assert old in source, old
        source = source.replace(old, new)
    spec = importlib.util.spec_from_loader("layout_model_under_test", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    exec(compile(source, "layout_model.py", "exec"), module.__dict__)
    return module


KINDS = ("param_bytes", "grad_bytes", "grad_peak_bytes", "optimizer_bytes", "activation_bytes")


def missed(model, measured):
    """{mode: [kind, ...]} the lesson's check would flag: each kind off its prediction by more than 2 %."""
    shapes, out = model.Shapes(**SMALL), {}
    for mode, record in measured.items():
        got = {k: max(rank[k] for rank in record["per_rank"]) for k in KINDS}
        wrong = model.misses(model.held(shapes, model.layout_of(mode, 2), BATCH), got, {k: 0.02 for k in KINDS})
        sent = model.sent(shapes, model.layout_of(mode, 2), BATCH)
        wrong += [(k, v, record["per_rank"][0]["sent"].get(k)) for k, v in sent.items()
                  if abs(record["per_rank"][0]["sent"].get(k, 0) / v - 1) > 0.02]
        if wrong:
            out[mode] = [w[0] for w in wrong]
    return out


def test_the_model_as_written_meets_every_measurement(scripts, measured):
    assert missed(load_model(scripts), measured) == {}


def test_the_check_fails_when_adam_loses_its_second_moment(scripts, measured):
    model = load_model(scripts, "def held(s: Shapes, lay: Layout, batch: int, b: int = 4, moments: int = 2)",
                       "def held(s: Shapes, lay: Layout, batch: int, b: int = 4, moments: int = 1)")
    assert missed(model, measured) == {mode: ["optimizer_bytes"] for mode in ("ddp", "zero1", "zero2", "fsdp")}


def test_the_check_fails_when_zero2_forgets_its_whole_gradient_during_backward(scripts, measured):
    model = load_model(scripts, "grad_peak_bytes=b * local / (lay.dp if lay.zero >= 3 else 1)",
                       "grad_peak_bytes=b * local / zero[2]")
    assert missed(model, measured) == {"zero2": ["grad_peak_bytes"]}


def test_the_check_fails_when_fsdp_gathers_each_block_once(scripts, measured):
    model = load_model(scripts, "gathered = 2 * s.blocks", "gathered = s.blocks")
    assert missed(model, measured) == {"fsdp": ["all-gather"]}


def test_the_check_fails_when_activations_forget_the_mlps_hidden_output(scripts, measured):
    model = load_model(scripts, "(4 if s.gated else 2) * h / t", "(3 if s.gated else 1) * h / t")
    assert missed(model, measured) == {mode: ["activation_bytes"] for mode in ("ddp", "zero1", "zero2", "fsdp")}


def test_flops_miss_when_backward_is_counted_as_one_forward(scripts, measured):
    """The lesson's FLOP check (0.5 %) against FlopCounterMode: right as written, wrong with backward = forward."""
    for source, right in (({}, True), ({"old": "(3 * block + recompute)", "new": "(2 * block + recompute)"}, False)):
        model = load_model(scripts, **source)
        counted = model.flops(model.Shapes(**SMALL), model.Layout(dp=2), BATCH, attention=False)  # CPU: as counted
        assert all((abs(r["per_rank"][0]["flops"] / counted - 1) < 0.005) == right for r in measured.values())


def cell(text):
    """The source of the lesson's code cell that contains ``text``."""
    sources = ["".join(c["source"]) for c in json.loads((NOTEBOOKS / NOTEBOOK).read_text())["cells"]
               if c["cell_type"] == "code"]
    (found,) = [s for s in sources if text in s]
    return found


def run_exercise(exercise_cell, check_cell, space):
    """Run an exercise cell, then its check cell, as the notebook would; return the verdict line."""
    exec("from helpers.exercises import check", space)
    exec(exercise_cell, space)
    exec(check_cell.rstrip().rstrip(";").replace('check("', 'verdict = check("', 1), space)
    return space["verdict"]


def test_exercise_12a_check_fails_on_the_stub_and_on_wrong_formulas(scripts, measured):
    model = load_model(scripts)
    runs = {(mode, 2, False): record for mode, record in measured.items()}
    space = lambda: dict(runs=runs, TINY=model.Shapes(**SMALL), measured_held=lambda r: {  # noqa: E731
        k: max(rank[k] for rank in r["per_rank"]) for k in KINDS})
    solution, checker = cell("# Exercise 12a"), cell('check("12a"')
    assert run_exercise(solution, checker, space()).startswith("Exercise 12a: every kind")
    with pytest.raises(ExerciseFailed, match="^Exercise 12a: not written yet"):
        run_exercise(stub(solution), checker, space())
    one_moment = replace_solution(solution, "12a", '"optimizer_bytes": 2 * b', '"optimizer_bytes": b')
    with pytest.raises(ExerciseFailed, match=r"^Exercise 12a: ddp on 2 rank\(s\): optimizer_bytes MEASURED "):
        run_exercise(one_moment, checker, space())
    zero2_whole = replace_solution(solution, "12a", '(2, ("zero2", "fsdp"))', '(2, ("fsdp",))')
    with pytest.raises(ExerciseFailed, match=r"^Exercise 12a: zero2 on 2 rank\(s\): grad_bytes MEASURED 43,648 "):
        run_exercise(zero2_whole, checker, space())


def test_exercise_12b_check_fails_on_the_stub_and_on_adding_the_whole_allreduce():
    solution, checker = cell("# Exercise 12b"), cell('check("12b"')  # the check cell holds its cases
    assert run_exercise(solution, checker, {}).startswith("Exercise 12b: all 3 cases")
    with pytest.raises(ExerciseFailed, match="^Exercise 12b: not written yet"):
        run_exercise(stub(solution), checker, {})
    whole = replace_solution(solution, "12b", new="return forward + backward + sum(allreduces) + optimizer")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 12b: 4 quick buckets: only the last shows .*expected 5.5 s, "
                                             r"got 7.0$"):
        run_exercise(whole, checker, {})
    no_queue = replace_solution(solution, "12b", "done = max(ready, done) + seconds", "done = ready + seconds")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 12b: 2 slow buckets: they queue .*expected 7.0 s, got 5.0$"):
        run_exercise(no_queue, checker, {})


@pytest.mark.parametrize("script, flags, message", [
    ("layout_measure.py", ["--modes", "single", "--world-size", 2], "mode single is one process"),
    ("layout_measure.py", ["--modes", "ddp", "--batch-size", 5], "--batch-size 5 must be a multiple of the 2"),
    ("layout_measure.py", ["--modes", "tp", "--world-size", 3], "tensor parallelism over 3 ranks needs 3 to divide"),
    ("layout_measure.py", ["--checkpointing", 2], "--checkpointing: must be an integer >= 0 and <= 1, got 2"),
    ("layout_fake_tracker.py", ["--dim", 100, "--heads", 3], "--heads 3 must divide --dim 100"),
    ("layout_search.py", ["--models", "405B"], "invalid choice: '405B'"),
], ids=["single-on-two", "batch", "tp-heads", "checkpointing", "fake-heads", "unknown-model"])
def test_bad_flags_exit_with_a_one_line_error_before_launching(scripts, script, flags, message):
    assert message in refusal(scripts[script], *flags)
