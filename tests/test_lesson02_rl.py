"""Lesson 02: the agent/observer RPC script (rl_rpc.py), run for a few episodes of each design."""

import time

import pytest

from helpers.launch import ScriptError, run_script
from helpers.metrics import read_metrics

NOTEBOOK = "02_rl_rpc.ipynb"


def train(script, run, design, observers, episodes=4, seed=0):
    """Run a few agent episodes; return (per-episode records, summary record)."""
    run_script(script, "--design", design, "--world-size", observers + 1, "--episodes", episodes,
               "--seed", seed, "--run-dir", run, echo=False, timeout=120)
    records = read_metrics(run)
    return [r for r in records if "running_reward" in r], next(r for r in records if "solved" in r)


@pytest.fixture
def script(lesson_scripts):
    return lesson_scripts(NOTEBOOK)["rl_rpc.py"]


def test_naive_design_makes_two_rpcs_per_step(script, tmp_path):
    episodes, _ = train(script, tmp_path / "naive", "naive", observers=2)
    assert len(episodes) == 4
    for r in episodes:  # N run_episode calls + select_action and report_reward per step
        assert r["rpcs"] == 2 + 2 * r["steps"] == r["rpcs_made"], r


def test_batched_design_makes_one_rpc_per_step(script, tmp_path):
    episodes, _ = train(script, tmp_path / "batched", "batched", observers=3)
    assert len(episodes) == 4
    for r in episodes:  # N run_episode calls + one act per step
        assert r["rpcs"] == 3 + r["steps"] == r["rpcs_made"], r


def test_learning_updates_the_policy(script, tmp_path):
    _, summary = train(script, tmp_path / "run", "batched", observers=1, episodes=3)
    assert summary["episodes"] == 3 and not summary["solved"]
    assert summary["weight_change"] > 1e-3, summary


def test_both_designs_play_the_same_episodes_for_a_seed(script, tmp_path):
    naive, _ = train(script, tmp_path / "naive", "naive", observers=2, seed=3)
    batched, _ = train(script, tmp_path / "batched", "batched", observers=2, seed=3)
    assert [r["reward"] for r in naive] == [r["reward"] for r in batched]
    assert [r["steps"] for r in naive] == [r["steps"] for r in batched]


def test_same_seed_gives_same_numbers_and_another_seed_does_not(script, tmp_path):
    first, _ = train(script, tmp_path / "a", "batched", observers=2, seed=5)
    again, _ = train(script, tmp_path / "b", "batched", observers=2, seed=5)
    other, _ = train(script, tmp_path / "c", "batched", observers=2, seed=6)
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
