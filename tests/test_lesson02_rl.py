"""Lesson 02: the agent/observer RPC script (rl_rpc.py), its single-process baseline and the recipe they share."""

import pytest
import torch
from conftest import refusal, write_scripts

from helpers.launch import ScriptError, run_script
from helpers.metrics import read_metrics

NOTEBOOK = "02_rl_rpc.ipynb"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson02")
    write_scripts(folder, NOTEBOOK)
    return folder


def run(scripts, folder, design, observers, *flags, seed=3, episodes=4, timeout=120):
    """Run one design for a few agent episodes; return (per-episode records, summaries)."""
    if design == "single":
        script, world = "single_process.py", ["--envs", observers]
    else:
        script, world = "rl_rpc.py", ["--design", design, "--world-size", observers + 1]
    run_script(scripts / script, *world, "--episodes", episodes, "--seed", seed, "--run-dir", folder, *flags,
               echo=False, timeout=timeout)
    records = read_metrics(folder)
    return [r for r in records if "running_reward" in r], [r for r in records if "solved" in r]


@pytest.fixture(scope="module")
def runs(scripts, tmp_path_factory):
    """``runs(design, observers=2, seed=3, again=False)``: each short run made once per module."""
    done = {}

    def get(design, observers=2, seed=3, again=False):
        key = design, observers, seed, again
        if key not in done:
            folder = tmp_path_factory.mktemp(f"{design}_{observers}_{seed}")
            done[key] = run(scripts, folder, design, observers, seed=seed)
        return done[key]

    return get


def test_naive_design_makes_two_rpcs_and_one_forward_pass_per_step(runs):
    episodes, _ = runs("naive")
    assert len(episodes) == 4
    for r in episodes:
        assert r["rpcs"] == r["rpcs_made"] == 2 * r["steps"] == 2 * r["forwards"], r


def test_batched_design_makes_one_rpc_per_step_and_one_forward_pass_per_round(runs):
    episodes, _ = runs("batched")
    assert len(episodes) == 4
    for r in episodes:
        assert r["rpcs"] == r["rpcs_made"] == r["steps"], r
        assert r["forwards"] == r["longest"] < r["steps"], r


def test_single_process_makes_one_forward_pass_per_round(runs):
    episodes, _ = runs("single")
    assert all(r["forwards"] == r["longest"] < r["steps"] for r in episodes), episodes


def test_every_design_plays_the_same_episodes_and_learns_the_same_weights(runs):
    played = {d: runs(d) for d in ("naive", "batched", "single")}
    numbers = {d: [(r["steps"], r["longest"], r["reward"], r["running_reward"]) for r in eps]
               for d, (eps, _) in played.items()}
    assert numbers["naive"] == numbers["batched"] == numbers["single"]
    changes = {d: summaries[0]["weight_change"] for d, (_, summaries) in played.items()}
    assert changes["naive"] == changes["batched"] == changes["single"] > 1e-3, changes


def test_same_seed_gives_same_numbers_and_another_seed_does_not(runs):
    first, again, other = runs("single")[0], runs("single", again=True)[0], runs("single", seed=4)[0]
    numbers = [[(r["reward"], r["running_reward"]) for r in eps] for eps in (first, again, other)]
    assert numbers[0] == numbers[1]
    assert numbers[0] != numbers[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the check is run by the notebook")
def test_observers_report_that_they_never_initialised_cuda(runs):
    for design in ("naive", "batched"):
        (summary,) = runs(design)[1]
        assert summary["observers_used_cuda"] is False and summary["device"] == "cpu", summary


def test_batched_rounds_stay_whole_with_three_observers_over_many_episodes(scripts, tmp_path):
    # An episode end handled by a callback that may run after the agent's wait returned (add_done_callback,
    # then wait() on the same futures) let batches fire without one observer in dozens of these 300 episodes;
    # with a tiny learning rate they stay short.
    episodes, _ = run(scripts, tmp_path, "batched", 3, "--lr", "1e-6", episodes=300, timeout=180)
    assert len(episodes) == 300
    torn = [(r["step"], r["forwards"], r["longest"]) for r in episodes if r["forwards"] != r["longest"]]
    assert not torn, f"(episode, forward passes, longest episode) where a batch missed an observer: {torn}"


def test_each_step_cost_replays_the_same_episodes_and_burns_its_cpu_time(scripts, tmp_path):
    episodes, summaries = run(scripts, tmp_path, "single", 2, "--step-cost", "0", "5", episodes=3)
    by_cost = {c: [r for r in episodes if r["step_cost"] == c] for c in (0.0, 5.0)}
    assert [r["reward"] for r in by_cost[0.0]] == [r["reward"] for r in by_cost[5.0]]
    steps = sum(r["steps"] for r in by_cost[5.0])
    seconds = {s["step_cost"]: s["seconds"] for s in summaries}
    assert seconds[5.0] - seconds[0.0] >= 0.9 * steps * 0.005, (seconds, steps)  # load can only add to it


@pytest.mark.parametrize("script, flags, message", [
    ("rl_rpc.py", ["--world-size", "1", "--step-cost", "2"], "--world-size 1 leaves no observer"),
    ("rl_rpc.py", ["--step-cost", "-0.5"], "argument --step-cost: must be a finite number >= 0"),
    ("rl_rpc.py", ["--reward-threshold", "500"], "--reward-threshold 500 is out of reach"),
    ("rl_rpc.py", ["--env", "NoSuchEnv-v0"], "unknown environment id 'NoSuchEnv-v0'"),
    ("rl_rpc.py", ["--design", "fast"], "argument --design: invalid choice: 'fast'"),
    ("rl_rpc.py", ["--episodes", "0"], "argument --episodes: must be an integer >= 1"),
    ("single_process.py", ["--envs", "0"], "argument --envs: must be an integer >= 1"),
    ("single_process.py", ["--gamma", "1"], "argument --gamma: must be a finite number >= 0 and < 1"),
    ("single_process.py", ["--dropout", "nan"], "argument --dropout: must be a finite number"),
    ("single_process.py", ["--lr", "0"], "argument --lr: must be a finite number <= 1 and > 0"),
    ("single_process.py", ["--run-dir", "/dev/null/runs"], "argument --run-dir: cannot create folder"),
], ids=["step-cost-no-observer", "negative-step-cost", "threshold-above-max", "unknown-env", "unknown-design",
        "no-episode", "no-environment", "gamma-1", "dropout-nan", "lr-0", "run-dir-not-a-folder"])
def test_bad_input_is_a_one_line_error_before_spawning(scripts, script, flags, message, tmp_path):
    assert message in refusal(scripts / script, *flags, cwd=tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_cuda_without_a_gpu_is_a_one_line_error(scripts):
    with pytest.raises(ScriptError) as failed:
        run_script(scripts / "rl_rpc.py", "--device", "cuda", echo=False, timeout=60)
    first_line = str(failed.value).splitlines()[0]
    assert "exit code 2" in first_line and "no GPU is visible here" in first_line, str(failed.value)
    assert "[rank" not in str(failed.value) and "Traceback" not in str(failed.value)
