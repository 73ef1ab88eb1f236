"""Lesson 07: the RPC parameter server (rpc_ps.py) and the synchronous one (sync_ps.py), run for real.

The notebook's quick run checks its own runs (the naive race, the versioned server with 1 and 2 trainers
and its eval mode, the evaluator's checkpoints, fp16 bytes, lockstep and backup workers, one bad flag of
each script from the command line); these tests add a run under torchrun with backup workers, fp16 and a
straggler, and every bad flag of both scripts, on main() in this process.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_scripts

from helpers.data import load_mnist
from helpers.exercises import ExerciseFailed, check, replace_solution, stub
from helpers.metrics import read_metrics
from helpers.runner import run_script

NOTEBOOK = "07_parameter_server.ipynb"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
STEPS, EVAL_FREQ, SLOW_MS = 16, 4, 30


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson07_scripts")
    write_scripts(folder, NOTEBOOK)
    return folder


@pytest.fixture(scope="module")
def modules(scripts):
    """The scripts imported here: bad flags are tried on their main() in this process; ps_nets scores weights."""
    sys.path.insert(0, str(scripts))
    import ps_nets
    import rpc_ps
    import sync_ps

    yield {"rpc_ps.py": rpc_ps, "sync_ps.py": sync_ps, "ps_nets": ps_nets}
    sys.path.remove(str(scripts))
    for name in ("rpc_ps", "sync_ps", "ps_nets", "rpc_ps_flags", "sync_ps_flags", "sync_ps_evaluator"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def accuracy_of(modules):
    """``accuracy_of(state_dict)``: LeNet's test accuracy with these weights, in eval mode, on one thread."""
    test = load_mnist(download=False, verbose=False).test

    def score(state):
        model = modules["ps_nets"].NETWORKS["lenet"]()
        model.load_state_dict(state)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as in the server and the evaluator: the same order of sums
        try:
            return modules["ps_nets"].accuracy(model, test)
        finally:
            torch.set_num_threads(threads)

    return score


@pytest.fixture(scope="module")
def sync_run(scripts, tmp_path_factory):
    """sync_ps.py under torchrun: a server, 2 workers (worker 1 slowed), 1 backup worker, fp16, an evaluator."""
    folder = tmp_path_factory.mktemp("sync_ps")
    run_script(scripts / "sync_ps.py", "--world-size", 4, "--backup-workers", 1, "--compress", "fp16",
               "--straggler-ms", SLOW_MS, "--max-steps", STEPS, "--eval-freq", EVAL_FREQ, "--lr", 0.05,
               "--run-dir", folder, "--train-dir", folder / "train", command=TORCHRUN, echo=False, timeout=180)
    records = read_metrics(folder)
    return dict(folder=folder, steps=[r for r in records if r["rank"] == 0 and not r.get("summary")],
                summary=next(r for r in records if r.get("summary")),
                evaluator=[r for r in records if r["rank"] == 3])


def test_evaluator_outside_the_group_scores_every_checkpoint_once(sync_run):
    saved = sorted(int(p.stem.split("-")[1]) for p in (sync_run["folder"] / "train").glob("ckpt-*.pt"))
    assert saved == [r["step"] for r in sync_run["evaluator"]] == list(range(0, STEPS + 1, EVAL_FREQ))
    assert not any(r["in_group"] for r in sync_run["evaluator"]), "the evaluator joined a process group"
    assert not list((sync_run["folder"] / "train").glob(".*")), "a temporary checkpoint file was left"


def test_checkpoints_load_and_give_the_evaluators_accuracy(sync_run, accuracy_of):
    for record in sync_run["evaluator"]:
        checkpoint = torch.load(sync_run["folder"] / "train" / record["checkpoint"])
        assert checkpoint["step"] == record["step"] and checkpoint["final"] == (record["step"] == STEPS)
        tolerance = 0.002 if torch.cuda.is_available() else 0.0  # the evaluator computed on the GPU, here the CPU
        assert abs(accuracy_of(checkpoint["model"]) - record["accuracy"]) <= tolerance
    accuracies = [r["accuracy"] for r in sync_run["evaluator"]]
    assert accuracies[-1] > accuracies[0], accuracies


def test_backup_worker_drops_the_stragglers_gradients(sync_run):
    assert [r["step"] for r in sync_run["steps"]] == list(range(1, STEPS + 1))
    late = [w for r in sync_run["steps"] for w, _ in r["late"]]
    assert late and late.count(1) > len(late) / 2, f"worker 1 was slowed, yet the dropped gradients were {late}"
    used = [w for r in sync_run["steps"] for w in r["used"]]
    assert used.count(2) > used.count(1), f"the fast worker's gradients should be used more: {used}"


def test_fp16_compression_halves_the_gradient_payload(sync_run):
    state = torch.load(sync_run["folder"] / "train" / f"ckpt-{STEPS:06d}.pt")["model"]
    parameters = sum(t.numel() for t in state.values())
    for r in sync_run["steps"]:
        gradients = len(r["used"]) + len(r["late"])
        assert r["bytes_received"] == gradients * (2 * 8 + 2 * parameters), r
        assert r["bytes_sent"] % (4 * (1 + parameters)) == 0, "weights go down in float32"


def written_checkpoint(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "ckpt-000010.pt").write_bytes(b"")
    return tmp_path / "old"


BAD_FLAGS = [
    ("rpc_ps.py", ["--world-size", "1"], "--world-size 1 is below the roles"),
    ("rpc_ps.py", ["--network", "vgg"], "invalid choice: 'vgg'"),
    ("rpc_ps.py", ["--world-size", "3", "--batch-size", "3000"], "is more than each trainer's"),
    ("rpc_ps.py", ["--eval-freq", "0"], "--eval-freq: must be an integer >= 1, got 0"),
    ("rpc_ps.py", ["--lr", "0"], "--lr: must be a finite number"),
    ("sync_ps.py", ["--world-size", "2"], "--world-size 2 is below the roles"),
    ("sync_ps.py", ["--network", "vgg"], "invalid choice: 'vgg'"),
    ("sync_ps.py", ["--train-dir", "{file}/train"], "cannot be written"),
    ("sync_ps.py", ["--train-dir", "{old}"], "holds checkpoints of an earlier run"),
    ("sync_ps.py", ["--world-size", "4", "--backup-workers", "2"], "--backup-workers 2 leaves no gradient"),
    ("sync_ps.py", ["--eval-freq", "0"], "--eval-freq: must be an integer >= 1, got 0"),
    ("sync_ps.py", ["--compress", "int8"], "invalid choice: 'int8'"),
    ("sync_ps.py", ["--momentum", "1"], "--momentum: must be a finite number"),
]


@pytest.mark.parametrize("script, flags, message", BAD_FLAGS, ids=[f"{s[:-3]}:{' '.join(f)}" for s, f, _ in BAD_FLAGS])
def test_bad_flags_are_refused_in_one_line_before_spawning(modules, script, flags, message, tmp_path, monkeypatch,
                                                           capsys):
    (tmp_path / "file").write_text("")
    flags = [f.format(file=tmp_path / "file", old=written_checkpoint(tmp_path) if "{old}" in f else "")
             for f in flags]
    if script == "sync_ps.py" and "--train-dir" not in flags:
        flags += ["--train-dir", str(tmp_path / "train")]
    module = modules[script]
    monkeypatch.setattr(module, "launch", lambda *a, **k: pytest.fail(f"{script} {flags} spawned workers"))
    with pytest.raises(SystemExit) as refused:
        module.main([*flags, "--run-dir", str(tmp_path / "runs")])
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused.value.code == 2 and message in last_line, last_line


def exercise_07a_cells():
    """The source of exercise 07a's cell and of the cell that checks it, from the notebook."""
    cells = ["".join(c["source"]) for c in json.loads(
        (Path(__file__).resolve().parent.parent / "notebooks" / NOTEBOOK).read_text())["cells"]
        if c["cell_type"] == "code"]
    exercise = next(c for c in cells if "# Exercise 07a:" in c)
    harness = next(c for c in cells if "def versioned_update_problem" in c)
    return exercise, harness


def problem_07a(exercise_source, harness):
    space = {"torch": torch}
    exec(exercise_source + "\n" + harness, space)  # noqa: S102 (the notebook's own cells)
    return check("07a", lambda: space["versioned_update_problem"](space["VersionedWeights"]))


def test_exercise_07a_check_passes_the_solution_and_fails_the_stub():
    exercise, harness = exercise_07a_cells()
    assert problem_07a(exercise, harness) == "Exercise 07a: correct"
    with pytest.raises(ExerciseFailed, match="^Exercise 07a: not written yet"):
        problem_07a(stub(exercise), harness)


@pytest.mark.parametrize("old, new, message", [
    ("self.published = self.live.clone()", "self.published = self.live",
     r"the copy of version \d+ changed after it was handed out"),
    ("            self.version += 1\n", "", r"after 160 updates the version is 0, expected 160"),
    ("staleness = self.version - version", "staleness = self.version - version + 1",
     r"version read \+ staleness \+ 1 must number the updates 1..160 once each; 1 is not"),
    ("            self.live -= self.lr * gradient\n            staleness = self.version - version\n"
     "            self.version += 1\n            self.published = self.live.clone()",
     "            self.published = self.live.clone()\n            self.live -= self.lr * gradient\n"
     "            staleness = self.version - version\n            self.version += 1",
     r"the copy of version \d+ element \[0\]: expected .*, got "),  # which version is checked first: threads
], ids=["publishes-the-live-weights", "loses-the-version", "staleness-off-by-one", "publishes-before-the-step"])
def test_exercise_07a_check_fails_on_a_wrong_update(old, new, message):
    exercise, harness = exercise_07a_cells()
    with pytest.raises(ExerciseFailed, match=f"^Exercise 07a: {message}"):
        problem_07a(replace_solution(exercise, "07a", old, new), harness)
