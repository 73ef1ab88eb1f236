"""The warm starter: a script forked from it behaves as ``python -u script args`` would, and it leaves nothing."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from helpers import warm
from helpers.runner import ScriptError, run_script, running_children

pytestmark = pytest.mark.skipif(not warm.usable(), reason="the warm starter runs on Linux with no GPU present")


@pytest.fixture(autouse=True)
def own_starter(monkeypatch):
    """These tests are of this process's own starter: not of the one the test run lends (conftest.py)."""
    monkeypatch.delenv(warm.SHARED, raising=False)

PROBE = textwrap.dedent('''
    import json, os, sys
    import numpy, torch
    from helpers.launch import choose_start_method, launch, pick_backend

    def rank(worker, out):
        import signal
        with open(f"{out}/rank{worker.rank}.json", "w") as f:
            json.dump({"seed": torch.initial_seed(), "numpy": int(numpy.random.randint(1 << 30)),
                       "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}, f)

    if __name__ == "__main__":
        print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "file": __file__, "name": __name__,
                          "env": os.environ.get("PROBE"), "stdin": sys.stdin.read(), "pid": os.getpid(),
                          "ppid": os.getppid(), "session_leader": os.getsid(0) == os.getpid(),
                          "seed": torch.initial_seed(), "numpy": int(numpy.random.randint(1 << 30)),
                          "hash": hash("course"),
                          "method": choose_start_method(pick_backend("auto", 2))}))
        print("to stderr", file=sys.stderr)
        launch(rank, 2, sys.argv[1])
        code = int(sys.argv[2])
        if code == 99:
            raise KeyError("the probe fails on purpose")
        sys.exit(code)
''')


def probe(tmp_path, code=0, env=None):
    (tmp_path / "probe.py").write_text(PROBE)
    out = tmp_path / f"out{time.monotonic_ns()}"
    out.mkdir()
    run = run_script("probe.py", out, code, cwd=tmp_path, env={"PROBE": "yes", **(env or {})}, echo=False,
                     timeout=120)
    seen = json.loads(run.output.splitlines()[0])
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return run, seen, ranks


def test_a_warm_script_is_what_python_would_have_run(tmp_path):
    run, seen, ranks = probe(tmp_path)
    assert seen["ppid"] in warm.server_pids(), "the script should have been forked by the warm starter"
    assert seen["argv"][1:] == ["0"] and seen["cwd"] == str(tmp_path) and seen["name"] == "__main__"
    assert seen["file"] == str(tmp_path / "probe.py") and seen["env"] == "yes" and seen["stdin"] == ""
    assert seen["session_leader"], "run_script's kill_group needs the script to lead its own session"
    assert "to stderr" in run.output, "stderr goes into the same stream as stdout"
    assert seen["method"] == "fork" and len(ranks) == 2
    assert all(r["sigterm_default"] for r in ranks), "a forked worker must die on SIGTERM as a spawned one does"


def test_each_script_and_each_worker_gets_fresh_random_seeds(tmp_path):
    _, first, first_ranks = probe(tmp_path)
    _, second, second_ranks = probe(tmp_path)
    seeds = [first["seed"], second["seed"], *(r["seed"] for r in first_ranks + second_ranks)]
    draws = [first["numpy"], second["numpy"], *(r["numpy"] for r in first_ranks + second_ranks)]
    assert len(set(seeds)) == len(seeds), f"torch seeds repeat across processes: {seeds}"
    assert len(set(draws)) == len(draws), f"numpy draws repeat across processes: {draws}"


def test_exit_codes_and_tracebacks_come_back(tmp_path):
    with pytest.raises(ScriptError, match="probe.py failed with exit code 3"):
        probe(tmp_path, code=3)
    with pytest.raises(ScriptError, match=r"(?s)exit code 1.*KeyError: 'the probe fails on purpose'"):
        probe(tmp_path, code=99)
    assert not running_children()


ENDING = textwrap.dedent('''
    import atexit, sys, threading, time

    def late():
        time.sleep(0.5)
        print("thread done")

    atexit.register(print, "exit handler ran")
    threading.Thread(target=late).start()  # not a daemon: the interpreter waits for it before the exit handlers
    print("main done")
    sys.exit(int(sys.argv[1]))
''')


@pytest.mark.parametrize("code", [0, 5])
def test_a_warm_script_ends_as_python_would_threads_joined_exit_handlers_run_exit_code_back(tmp_path, code):
    """A copy leaves without the teardown of its modules (helpers.warm._leave), but after what the interpreter
    does first: join the script's non-daemon threads, then run its exit handlers."""
    (tmp_path / "ending.py").write_text(ENDING)
    outputs = []
    for env in ({}, {"COURSE_WARM": "0"}):
        try:
            run = run_script("ending.py", code, cwd=tmp_path, env=env, echo=False, timeout=60)
            outputs.append((run.warm, 0, run.output))
        except ScriptError as error:
            outputs.append((None, int(re.search(r"exit code (-?\d+)", str(error))[1]), error.output))
    (warm_run, warm_code, warm_out), (fresh_run, fresh_code, fresh_out) = outputs
    assert warm_out == fresh_out == "main done\nthread done\nexit handler ran\n" and warm_code == fresh_code == code
    assert code or (warm_run and not fresh_run), "the first run should have been forked by the warm starter"


def test_another_import_time_environment_gets_a_starter_that_imported_under_it(tmp_path):
    _, first, _ = probe(tmp_path)  # the warm starter runs
    seed = "123" if os.environ.get("PYTHONHASHSEED") != "123" else "321"
    fresh = subprocess.run([sys.executable, "-c", "print(hash('course'))"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout
    _, seen, _ = probe(tmp_path, env={"PYTHONHASHSEED": seed})
    assert seen["hash"] == int(fresh), "Python reads PYTHONHASHSEED as it starts: the script must hash with it"
    assert seen["ppid"] in warm.server_pids() and seen["ppid"] != first["ppid"] \
        and not psutil.pid_exists(first["ppid"]), \
        "the starter should have been replaced by one that started with the new PYTHONHASHSEED"
    _, seen, ranks = probe(tmp_path, env={"COURSE_WARM": "0"})
    assert seen["ppid"] == os.getpid() and seen["method"] == "spawn" and len(ranks) == 2


LENT = textwrap.dedent('''
    import json, os, sys, threading, time
    from helpers import warm
    from helpers.runner import run_script, running_children

    def ppid(**env):
        return int(run_script("ppid.py", cwd=sys.argv[1], echo=False, env=env).output)

    seen = {"lent": ppid()}
    import torch._dynamo  # sets TORCHINDUCTOR_CACHE_DIR (to its default), as the starter's own imports did
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"]
    seen.update(dynamo=ppid(), other=ppid(PYTHONHASHSEED="7"), own=sorted(warm.server_pids()))
    slow = threading.Thread(target=run_script, args=("ppid.py",), kwargs=dict(cwd=sys.argv[1], echo=False,
                                                                              env={"SLEEP": "3"}))
    slow.start()
    time.sleep(1.5)
    seen["counted"] = len(running_children())  # the lent starter's script, which is not this process's child
    slow.join()
    seen["after"] = len(running_children())
    print(json.dumps(seen))
''')


def test_a_lent_starter_serves_the_processes_started_after_it_only_its_own_environment_and_ends_with_its_caller(
        tmp_path):
    (tmp_path / "ppid.py").write_text("import os, time\nprint(os.getppid())\n"
                                      "time.sleep(float(os.environ.get('SLEEP', 0)))\n")
    lender = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\nfrom helpers import warm\nwarm.share()\n"
         "print(*warm.server_pids(), flush=True)\n"
         "subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]], check=True)\ntime.sleep(60)",
         LENT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        server, seen = int(lender.stdout.readline()), json.loads(lender.stdout.readline())
        assert seen["lent"] == server, "a process started after share() should fork its scripts from it"
        assert seen["dynamo"] == server, "what the starter's imports set themselves is no other environment"
        assert seen["other"] != server and seen["own"] == [seen["other"]], \
            "another import-time environment gets a starter of the caller's own"
        assert seen["counted"] == 1 and seen["after"] == 0, "a script the lent starter forked counts as a child"
        assert psutil.Process(server).ppid() == lender.pid
    finally:
        os.kill(lender.pid, signal.SIGKILL)
        lender.wait()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(server) and psutil.Process(server).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the warm starter outlived its caller"
        time.sleep(0.1)


def test_environment_a_process_reads_as_it_starts_set_for_the_workers_makes_them_spawned(tmp_path):
    (tmp_path / "arenas.py").write_text(
        "import os\nfrom helpers.launch import choose_start_method, pick_backend\n"
        "before = choose_start_method(pick_backend('auto', 2))\nos.environ['MALLOC_ARENA_MAX'] = '1'\n"
        "print(before, choose_start_method(pick_backend('auto', 2)))\n")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = run_script("arenas.py", cwd=tmp_path, env=env, echo=False).output.split()
    assert out == ["fork", "spawn"], "glibc reads MALLOC_ARENA_MAX as a process starts: a fork would not see it"


def test_the_benchmark_times_a_whole_run_cold_and_warm():
    from helpers.startup import time_scripts

    times = time_scripts(world_size=2)
    assert set(times) == {"cold", "warm"} and all(t > 0 for t in times.values()), times
