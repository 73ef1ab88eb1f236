"""helpers.launch: starting workers on this machine and under torchrun."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import helpers.warm
from helpers.launch import launch, pick_backend
from helpers.runner import ScriptError, run_script, running_children
from helpers.system import free_port, loopback_interface

SCRIPT = Path(__file__).parent / "scripts" / "collective.py"


def ranks_seen(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def children():
    return running_children()


def test_free_port_can_be_bound_on_loopback():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 1024 <= port <= 65535


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    """What each worker of one 3-rank launch recorded (one run serves the tests that only read it).

    The user chose TP_SOCKET_IFNAME (unused by this gloo-only run) and left GLOO_SOCKET_IFNAME empty."""
    out = tmp_path_factory.mktemp("three_ranks")
    run = run_script(SCRIPT, "--world-size", 3, "--out", out, echo=False, timeout=120,
                     env={"GLOO_SOCKET_IFNAME": "", "TP_SOCKET_IFNAME": "the-users-choice"})
    return [dict(s, warm=run.warm, freed=(out / f"freed{s['rank']}").exists()) for s in ranks_seen(out)]


def test_a_ranks_objects_outlive_its_function_until_the_process_ends(three_ranks):
    # freed at the return, in no set order, PyTorch's objects could deadlock (torch 2.11: DDP's reducer destroyed
    # the gloo group, which waited for a thread that needed the GIL); launch keeps them until os._exit
    assert not any(s["freed"] for s in three_ranks), "a rank's local object was freed as its function returned"


def test_a_run_says_how_its_script_and_workers_started(three_ranks):
    assert all(s["warm"] is helpers.warm.usable() for s in three_ranks), "forked from the starter where usable"
    methods = {s["start_method"] for s in three_ranks}
    # from the warm starter (one thread, no GPU) launch forks; from a fresh interpreter where a GPU is present, spawns
    assert methods == ({"fork"} if helpers.warm.usable() else {"spawn"}), methods


def test_workers_all_reduce_with_one_thread_each(three_ranks):
    seen = three_ranks
    assert [s["rank"] for s in seen] == [0, 1, 2]
    assert all(s["sum"] == 3.0 for s in seen), "all_reduce of ranks 0+1+2"
    assert all(s["threads"] == 1 for s in seen), "each worker is limited to one thread"
    assert len({s["pid"] for s in seen}) == 3, "three separate processes"
    assert all(s["backend"] == "gloo" and s["device"] == "cpu" for s in seen) or torch.cuda.is_available()
    assert all(s["placement"] == str(pick_backend("auto", 3)) for s in seen), "each worker knows the path taken"


def test_worker_ddp_syncs_weights_and_averages_gradients(three_ranks):
    seen = three_ranks
    assert seen[0]["ddp_weight"] == seen[1]["ddp_weight"] == seen[2]["ddp_weight"], "rank 0's weights everywhere"
    # rank r's input is r + 1 in both features, so d(sum)/dw is r + 1: the mean over 3 ranks is 2
    assert all(s["ddp_grad"] == [[2.0, 2.0]] for s in seen), [s["ddp_grad"] for s in seen]


def test_threads_none_keeps_pytorchs_default(tmp_path):
    run_script(SCRIPT, "--world-size", 2, "--threads", 0, "--out", tmp_path, echo=False, timeout=120)
    assert {s["threads"] for s in ranks_seen(tmp_path)} == {torch.get_num_threads()}
    # the script, forked from the warm starter, has computed nothing: its workers are forked, on all their threads
    assert {s["start_method"] for s in ranks_seen(tmp_path)} == {"fork" if helpers.warm.usable() else "spawn"}


def test_after_computing_on_several_threads_a_script_spawns_its_workers_of_several_threads(tmp_path):
    """GNU OpenMP's pool does not survive a fork: a worker forked after its parent computed on several threads
    would wait forever in its first parallel operation (this run's timeout), so launch spawns them."""
    run_script(SCRIPT, "--world-size", 2, "--threads", 0, "--compute-first", "--out", tmp_path, echo=False,
               timeout=120)
    pool = torch.get_num_threads() > 1  # with one thread, the script's operation started no pool
    assert {s["start_method"] for s in ranks_seen(tmp_path)} == {"fork" if helpers.warm.usable() and not pool
                                                                 else "spawn"}
    assert {s["threads"] for s in ranks_seen(tmp_path)} == {torch.get_num_threads()}


def test_local_launch_listens_on_loopback_only(three_ranks):
    addresses = {ip for s in three_ranks for ip in s["listening"]}
    assert addresses, "gloo workers should listen for their peers"
    assert addresses <= {"127.0.0.1", "::1"}, f"a worker listened off loopback: {addresses}"


def test_workers_get_this_systems_loopback_interface_and_keep_the_users_choice(three_ranks):
    # the interface is found in the OS's table (lo on Linux, lo0 on macOS), never typed in
    assert all(s["ifnames"] == {"GLOO_SOCKET_IFNAME": loopback_interface(), "TP_SOCKET_IFNAME": "the-users-choice",
                                "NCCL_SOCKET_IFNAME": loopback_interface()}
               for s in three_ranks), [s["ifnames"] for s in three_ranks]


def test_nccl_runs_get_nccl_socket_ifname_on_loopback(three_ranks, monkeypatch):
    # NCCL's bootstrap and proxy sockets listen on its default interface, never lo, unless told: launch tells it
    # for every local run, whatever the backend, so an NCCL run needs no GPU here to show the variable is set
    assert all(s["ifnames"]["NCCL_SOCKET_IFNAME"] == loopback_interface() for s in three_ranks)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    from helpers.system import socket_ifnames

    assert socket_ifnames()["NCCL_SOCKET_IFNAME"] == loopback_interface(), "torchrun's ranks get it too"


def test_worker_error_ends_run_with_traceback(tmp_path):
    temporary = tmp_path / "tmp"  # the run's temporary folder: its rendezvous files, the traceback's file
    temporary.mkdir()
    start = time.perf_counter()
    with pytest.raises(ScriptError) as failed:
        run_script(SCRIPT, "--world-size", 3, "--fail-rank", 1, "--out", tmp_path, echo=False, timeout=300,
                   env={"TMPDIR": str(temporary)})
    seconds = time.perf_counter() - start
    message = str(failed.value)
    assert message.splitlines()[0].endswith("ZeroDivisionError: deliberate failure on rank 1")
    assert "rank 1 raised" in message and 'collective.py", line' in message, "the rank's traceback"
    assert seconds < 60, f"the failure took {seconds:.0f} s to end the run (ranks 0 and 2 wait in a barrier)"
    left = [p.name for p in temporary.iterdir() if not p.name.startswith("torchinductor_")]  # a cache PyTorch keeps
    assert not left, f"the failed run left {left} behind"


def test_what_a_finished_worker_left_unflushed_is_printed(tmp_path):
    # started without -u or PYTHONUNBUFFERED, so the workers' stdout is a buffered pipe
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--world-size", "2", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rank 0 finished" in done.stdout and "rank 1 finished" in done.stdout, done.stdout


def test_worker_that_dies_is_reported_with_its_rank(tmp_path):
    with pytest.raises(ScriptError, match="rank 1 died with exit code 3") as failed:
        run_script(SCRIPT, "--world-size", 2, "--exit-rank", 1, "--out", tmp_path, echo=False, timeout=300)
    assert "rank 1 exits with code 3, skipping" in str(failed.value), "what the rank printed before dying"


def test_two_launches_at_once_do_not_collide(tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    errors = []

    def one(out):
        out.mkdir()
        try:
            run_script(SCRIPT, "--world-size", 2, "--out", out, echo=False, timeout=180)
        except ScriptError as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(out,)) for out in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [[s["sum"] for s in ranks_seen(out)] for out in outs] == [[1.0, 1.0], [1.0, 1.0]]


def test_same_script_runs_under_torchrun(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    run_script(SCRIPT, "--world-size", 2, "--out", tmp_path, command=torchrun, echo=False, timeout=180)
    seen = ranks_seen(tmp_path)
    assert [s["sum"] for s in seen] == [1.0, 1.0] and all(s["threads"] == 1 for s in seen)
    assert {s["start_method"] for s in seen} == {"torchrun"}
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        assert all(s["ifnames"][name] in (os.environ.get(name), loopback_interface()) for s in seen), \
            f"a one-machine torchrun run stays on loopback too ({name})"


@pytest.mark.skipif(not torch.distributed.is_nccl_available() or torch.cuda.device_count() < 2,
                    reason="an NCCL run needs two GPUs")
def test_an_nccl_run_listens_on_loopback_only(tmp_path):
    run_script(SCRIPT, "--world-size", 2, "--backend", "nccl", "--out", tmp_path, echo=False, timeout=180,
               env={"NCCL_SOCKET_IFNAME": ""})
    seen = ranks_seen(tmp_path)
    assert all(s["backend"] == "nccl" and s["ifnames"]["NCCL_SOCKET_IFNAME"] == loopback_interface() for s in seen)
    addresses = {ip for s in seen for ip in s["listening"]}
    assert addresses and addresses <= {"127.0.0.1", "::1"}, f"an NCCL rank listened off loopback: {addresses}"


def _top_level_worker(worker):
    raise AssertionError("must never run")


@pytest.mark.parametrize("world_size", [0, -2, 1.5, True])
def test_bad_world_size_is_refused_before_spawning(world_size):
    with pytest.raises(ValueError, match="world size must be an integer >= 1") as refused:
        launch(_top_level_worker, world_size)
    assert len(str(refused.value).splitlines()) == 1
    assert not children()


def test_unknown_backend_is_refused_before_spawning():
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        launch(_top_level_worker, 2, backend="mpi")
    assert not children()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_nccl_without_gpus_is_refused():
    with pytest.raises(ValueError, match="needs one GPU per rank"):
        pick_backend("nccl", 2)


@pytest.mark.skipif(not torch.distributed.is_nccl_available(), reason="this PyTorch has no NCCL")
def test_a_gpu_per_rank_means_nccl_and_rank_r_on_cuda_r():
    placement = pick_backend("auto", 2, gpus=2)
    assert (placement.backend, placement.device_type) == ("nccl", "cuda")
    assert [placement.device(r) for r in (0, 1)] == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert str(placement).startswith("NCCL, one GPU per rank")


def test_fewer_gpus_than_ranks_share_them_over_gloo():
    placement = pick_backend("auto", 3, gpus=1)  # a Colab notebook: one GPU, three ranks
    assert (placement.backend, placement.device_type) == ("gloo", "cuda")
    assert {placement.device(r) for r in range(3)} == {torch.device("cuda", 0)}
    assert "3 ranks share 1 GPU" in str(placement)
    assert [pick_backend("auto", 4, gpus=2).device(r).index for r in range(4)] == [0, 1, 0, 1]


def test_code_that_cannot_share_a_gpu_falls_back_to_the_cpu():
    assert pick_backend("auto", 2, share_gpus=False, gpus=1).device_type == "cpu"
    assert pick_backend("auto", 1, share_gpus=False, gpus=1).device_type == "cuda"
    # the path line gives the real reason: nobody asked for the CPU
    assert str(pick_backend("auto", 2, share_gpus=False, gpus=1, mps=False)) == (
        "gloo on the CPU (2 ranks, 1 GPU: this script's ranks do not share a GPU, so they compute on the CPU)")
    assert "3 GPUs:" in str(pick_backend("auto", 4, share_gpus=False, gpus=3))


def test_an_apple_gpu_is_never_picked_and_the_placement_says_so():
    mac = pick_backend("auto", 2, gpus=0, mps=True)
    assert (mac.backend, mac.device_type, mac.device(1)) == ("gloo", "cpu", torch.device("cpu"))
    assert str(mac) == ("gloo on the CPU (no CUDA GPU here; this Mac's MPS GPU stays unused: "
                        "gloo's collectives carry CPU tensors only)")
    assert pick_backend("auto", 1, gpus=0, mps=True).device(0) == torch.device("cpu"), "one rank: the CPU too"
    assert str(pick_backend("auto", 2, gpus=0, mps=False)) == "gloo on the CPU (no GPU here)"


def test_no_gpu_or_cpu_asked_for_means_gloo_on_the_cpu():
    assert (pick_backend("auto", 2, gpus=0).backend, str(pick_backend("auto", 2, gpus=0, mps=False))) == \
           ("gloo", "gloo on the CPU (no GPU here)")
    asked = pick_backend("auto", 2, device="cpu", gpus=2)
    assert (asked.backend, asked.device_type, asked.device(1)) == ("gloo", "cpu", torch.device("cpu"))
    assert str(asked) == "gloo on the CPU (the CPU was asked for, 2 GPUs unused)"
    assert str(pick_backend("auto", 2, device="cpu", gpus=1, share_gpus=False)) == \
        "gloo on the CPU (the CPU was asked for, 1 GPU unused)"


@pytest.mark.parametrize("kwargs, message", [
    (dict(backend="nccl", ranks_per_machine=2, gpus=1), "backend 'nccl' needs one GPU per rank: 2 ranks, 1 GPUs"),
    (dict(backend="nccl", device="cpu", gpus=2), "backend 'nccl' needs one GPU per rank"),
    (dict(device="cuda", gpus=0), "device 'cuda' asked for, but no GPU is visible"),
    (dict(device="tpu"), "unknown device 'tpu'"),
    (dict(backend="mpi"), "unknown backend 'mpi'"),
], ids=["nccl-one-gpu-two-ranks", "nccl-on-cpu", "cuda-without-gpu", "unknown-device", "unknown-backend"])
def test_impossible_placements_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as refused:
        pick_backend(**kwargs)
    assert len(str(refused.value).splitlines()) == 1


def test_function_from_a_notebook_is_refused(monkeypatch):
    main = sys.modules["__main__"]
    monkeypatch.delattr(main, "__file__", raising=False)  # what a Jupyter kernel's __main__ looks like
    notebook_fn = type(_top_level_worker)(_top_level_worker.__code__, {}, "in_a_cell")
    notebook_fn.__module__ = "__main__"
    with pytest.raises(ValueError, match="defined in a notebook or REPL.*run_script"):
        launch(notebook_fn, 2)
    assert not children()


def test_bad_flag_gives_one_line_error_before_any_worker(tmp_path):
    with pytest.raises(ScriptError) as failed:
        run_script(SCRIPT, "--world-size", 0, "--out", tmp_path, echo=False)
    assert failed.value.args[0].splitlines()[0].endswith(
        "error: argument --world-size: must be an integer >= 1, got 0")
    assert not list(tmp_path.iterdir()), "no worker may have started"


@pytest.mark.parametrize("backend, user_value", [("nccl", None), ("nccl", "0"), ("gloo", None)])
def test_an_exercise_run_on_nccl_raises_its_timeout_in_python(monkeypatch, backend, user_value):
    """On NCCL the watchdog would end a rank whose collective timed out with SIGABRT and no traceback, so the
    verdict could not say where each rank waited; an exercise run asks for blocking wait (the timeout raised in
    the rank's thread, as on gloo) and communicators aborted without tearing the process down. A value the user
    set stays; a gloo run and a run that is no exercise are left as they are."""
    import helpers.launch as launch_module
    from helpers.launch import NCCL_EXERCISE_ENV, Worker, pick_backend

    for name in NCCL_EXERCISE_ENV:  # set, then removed: monkeypatch restores the state from before the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    if user_value is not None:
        monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", user_value)
    seen = {}
    monkeypatch.setattr(launch_module.dist, "init_process_group", lambda **kw: seen.update(kw))
    worker = Worker(0, 1, 0, backend, torch.device("cpu"), "file:///x/pg", "file:///x/rpc",
                    pick_backend("gloo", 1, "cpu"))
    monkeypatch.delenv("COURSE_EXERCISE", raising=False)
    monkeypatch.setattr(sys, "argv", ["not_an_exercise.py"])
    worker.init_process_group()
    assert "timeout" not in seen and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ
    monkeypatch.setenv("COURSE_EXERCISE", "99z")
    worker.init_process_group()
    assert seen["timeout"].total_seconds() == 30 and seen["backend"] == backend
    if backend == "gloo":
        assert not any(name in os.environ for name in NCCL_EXERCISE_ENV)
    else:
        assert os.environ["TORCH_NCCL_BLOCKING_WAIT"] == (user_value or "1")
        assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
