"""Lesson 02: the agent/observer RPC script (rl_rpc.py), run for a few episodes of each design."""

import time

import pytest
from conftest import notebook_scripts

from helpers.launch import ScriptError, run_script
from helpers.metrics import read_metrics

NOTEBOOK = "02_rl_rpc.ipynb"
OBSERVERS = 2


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("lesson02") / "rl_rpc.py"
    path.write_text(notebook_scripts(NOTEBOOK)["rl_rpc.py"])
    return path


@pytest.fixture(scope="module")
def runs(script, tmp_path_factory):
    """``runs(design, seed, again=False)`` -> (per-episode records, summary); each run made once per module."""
    done = {}

    def get(design, seed, again=False):
        key = design, seed, again
        if key not in done:
            folder = tmp_path_factory.mktemp(f"{design}_seed{seed}")
            run_script(script, "--design", design, "--world-size", OBSERVERS + 1, "--episodes", 4,
                       "--seed", seed, "--run-dir", folder, echo=False, timeout=120)
            records = read_metrics(folder)
            done[key] = ([r for r in records if "running_reward" in r], next(r for r in records if "solved" in r))
        return done[key]

    return get


def test_naive_design_makes_two_rpcs_per_step(runs):
    episodes, _ = runs("naive", seed=3)
    assert len(episodes) == 4
    for r in episodes:  # N run_episode calls + select_action and report_reward per env step
        assert r["rpcs"] == OBSERVERS + 2 * r["steps"] == r["rpcs_made"], r


def test_batched_design_makes_one_rpc_per_step(runs):
    episodes, _ = runs("batched", seed=3)
    assert len(episodes) == 4
    for r in episodes:  # N run_episode calls + one act per env step
        assert r["rpcs"] == OBSERVERS + r["steps"] == r["rpcs_made"], r


def test_learning_updates_the_policy(runs):
    for design in ("naive", "batched"):
        _, summary = runs(design, seed=3)
        assert summary["episodes"] == 4 and not summary["solved"]
        assert summary["weight_change"] > 1e-3, summary


def test_both_designs_play_the_same_episodes_for_a_seed(runs):
    (naive, _), (batched, _) = runs("naive", seed=3), runs("batched", seed=3)
    assert [(r["steps"], r["reward"], r["running_reward"]) for r in naive] == \
           [(r["steps"], r["reward"], r["running_reward"]) for r in batched]


def test_same_seed_gives_same_numbers_and_another_seed_does_not(runs):
    first, again, other = runs("batched", 3)[0], runs("batched", 3, again=True)[0], runs("batched", 4)[0]
    numbers = [[(r["reward"], r["running_reward"]) for r in run] for run in (first, again, other)]
    assert numbers[0] == numbers[1]
    assert numbers[0] != numbers[2]


@pytest.mark.parametrize("flags, message", [
    (["--world-size", "1"], "--world-size 1 leaves no observer"),
    (["--reward-threshold", "500"], "--reward-threshold 500 is out of reach"),
    (["--env", "NoSuchEnv-v0"], "unknown environment id 'NoSuchEnv-v0'"),
], ids=["no-observer", "threshold-above-max", "unknown-env"])
def test_bad_input_is_a_one_line_error_before_spawning(script, flags, message):
    start = time.perf_counter()
    with pytest.raises(ScriptError) as failed:
        run_script(script, *flags, echo=False, timeout=60)
    first_line = str(failed.value).splitlines()[0]
    assert message in first_line
    assert "[rank" not in str(failed.value), "a worker was spawned"
    assert time.perf_counter() - start < 30
