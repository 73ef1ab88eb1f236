"""Lesson 17 (actors): exercise 17a's check fails where it should, bad input stops before any actor starts, and
nothing of the course resolves to the top-level folders Monarch's wheel installs (tests/, examples/, benches/).

The notebook's own run passes the reference gate through its check for every staleness bound (S = 0 against the
sync loop's weights, and S > 0 with a straggler), kills a rollout and checks that no process is left; here the
check meets the stub and two plausible wrong gates. The agent and observers on actors, lesson 03's RPC design with
an observer killed, and lesson 07's parameter server as actors beside its RPC version are run by the notebook; here
their bad input.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.exercises import ExerciseFailed, check_script, replace_solution, stub
from helpers.runner import ScriptError, run_script

NOTEBOOK = "17_actors.ipynb"
ROOT = Path(__file__).resolve().parent.parent
GATE = "return trainer_version - rollout_version <= staleness"
# the straggler's episodes (30 ms a step, 10 steps at the very least) come back after many updates of the other
# rollout, whose episodes a tiny learning rate keeps short; 60 updates outlast the first of them several times over
STRAGGLER = ("--updates", 60, "--staleness", 1, "--straggler-ms", 30, "--lr", 1e-6)


@pytest.fixture
def scripts(lesson_scripts):
    return lesson_scripts(NOTEBOOK)


def gate_check(scripts, tmp_path, *flags):
    return check_script("17a", scripts["async_rl.py"], "--mode", "async", "--rollouts", 2, "--seed", 1,
                        "--run-dir", tmp_path / "run", *flags, "--check", timeout=180, echo=False)


def write_gate(scripts, new=None):
    path = scripts["async_rl.py"]
    source = path.read_text()
    path.write_text(stub(source) if new is None else replace_solution(source, "17a", GATE, new))


def test_gate_check_fails_on_the_stub(scripts, tmp_path):
    write_gate(scripts)
    with pytest.raises(ExerciseFailed, match="^Exercise 17a: not written yet"):
        gate_check(scripts, tmp_path, "--updates", 2)


def test_gate_check_catches_an_off_by_one_that_refuses_every_fresh_episode(scripts, tmp_path):
    """`<` instead of `<=`: with S = 0 even an episode of the trainer's own version is refused, so no update
    ever happens; the loop notices within a bounded number of refusals instead of spinning until a timeout."""
    write_gate(scripts, "return trainer_version - rollout_version < staleness")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 17a: no update for \d+ episodes in a row, all refused "
                                             r"with S = 0; their staleness: \[0\]$"):
        gate_check(scripts, tmp_path, "--updates", 3, "--staleness", 0)


def test_gate_check_catches_the_trainers_version_checked_against_itself(scripts, tmp_path):
    """A gate that never looks at the episode's version lets the straggler's old episodes in."""
    write_gate(scripts, "return trainer_version - trainer_version <= staleness")
    with pytest.raises(ExerciseFailed, match=r"^Exercise 17a: an episode (\d+) versions old was used with S = 1$"):
        gate_check(scripts, tmp_path, *STRAGGLER)


def test_gate_check_passes_the_reference_with_a_straggler(scripts, tmp_path):
    """The same run as above with the reference gate: the straggler's old episodes are refused, none used."""
    line = gate_check(scripts, tmp_path, *STRAGGLER)
    used, oldest, refused = map(int, re.search(r"(\d+) episodes used, at most (\d+) versions old, (\d+) refused",
                                               line).groups())
    assert used == 2 * 60 and oldest <= 1 and refused > 0, line


@pytest.mark.parametrize("flags, message", [
    (["--mode", "sync", "--staleness", "1"], "apply to --mode async only"),
    (["--mode", "async", "--updates", "3", "--kill-after", "5"], "must be below --updates 3"),
    (["--rollouts", "1"], "--rollouts"),
    (["--mode", "single", "sync", "single"], "each mode and each bound once"),
], ids=["staleness-in-sync", "kill-after-the-end", "one-rollout", "a-mode-twice"])
def test_bad_input_stops_before_any_actor_starts(scripts, flags, message):
    with pytest.raises(ScriptError) as error:
        run_script(scripts["async_rl.py"], *flags, timeout=60, echo=False)
    assert message in str(error.value) and "[rank" not in error.value.output


@pytest.mark.parametrize("lesson, script, flags, message", [
    ("03_rl_rpc.ipynb", "rl_actors.py", ["--observers", "0"], "--observers"),
    ("03_rl_rpc.ipynb", "rl_rpc_killed.py", ["--kill-at", "5", "1", "--episodes", "4"],
     "comes after the last, --episodes 4"),
    ("07_parameter_server.ipynb", "ps_actor.py", ["--trainers", "0"], "--trainers"),
    ("07_parameter_server.ipynb", "ps_actor.py", ["--trainers", "1", "16", "--batch-size", "4000"],
     "--batch-size 4000 is more than each trainer's"),
], ids=["actors-no-observer", "rpc-kill-after-the-last-episode", "ps-no-trainer", "ps-batch-above-a-shard"])
def test_bad_input_of_the_rpc_designs_on_actors_stops_before_any_process_starts(lesson_scripts, lesson, script, flags,
                                                                                 message):
    """The agent and observers, and the parameter server: lesson 17's scripts import lesson 03's or 07's (the
    recipe, the networks, rpc_ps.py's flags); the parameter server's flags are checked by lesson 07's parse_flags."""
    lesson_scripts(lesson)
    with pytest.raises(ScriptError) as error:
        run_script(lesson_scripts(NOTEBOOK)[script], *flags, timeout=60, echo=False)
    assert message in str(error.value) and "[rank" not in error.value.output


def test_nothing_of_the_course_resolves_to_monarchs_top_level_folders():
    """Monarch's wheel puts tests/, examples/ and benches/ at the top of site-packages. From the course's root,
    `tests` finds the course's folder first, pytest's conftest is the course's, and no course file imports them."""
    import conftest

    assert Path(conftest.__file__).resolve().parent == ROOT / "tests"
    done = subprocess.run([sys.executable, "-c", "import tests; print(list(tests.__path__)[0])"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert Path(done.stdout.strip()).resolve() == ROOT / "tests", done.stdout + done.stderr
    pattern = re.compile(r"^\s*(?:from|import)\s+(tests|examples|benches)\b", re.M)
    found = [str(p.relative_to(ROOT)) for folder in ("helpers", "tests", "notebooks")
             for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".ipynb") and pattern.search(p.read_text())]
    assert not found, f"course files that import a top-level tests, examples or benches: {found}"
