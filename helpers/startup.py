"""How long starting a run takes, each way the course can start it (a benchmark, not a test).

    python -m helpers.startup --repeats 3     # the table below, each time the fastest of 3 runs

Two costs come before a script's first collective, and each has a cold and a warm way:

* the script's own process: a fresh ``python script.py`` imports torch first, and tears those modules down
  as it exits; :mod:`helpers.warm` forks the script from a process that imported torch once (``run_script``'s
  way on Linux without a GPU), and the copy leaves without that teardown;
* its workers: ``spawn`` starts a fresh interpreter per worker, which imports torch again; ``fork`` copies the
  script's process, torch included (``launch``'s way where :func:`helpers.launch.choose_start_method` allows it).

For 2 and 4 CPU workers, with and without one DDP step (whose first use imports ``torch._dynamo``), the table
gives *ready* (the call to the moment the last worker entered its function) and *joined* (the call to
``launch`` returning, after a gloo group, a barrier and the exit of every worker), for both start methods in
the same run; then the whole run of a small script through ``run_script``, a fresh interpreter with spawned
workers against the warm starter with forked ones.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from helpers import warm
from helpers.launch import launch
from helpers.runner import run_script

METHODS = ("spawn", "fork")


def _worker(worker, folder: str, ddp: bool) -> None:
    Path(folder, f"ready{worker.rank}").write_text(repr(time.time()))  # wall clock: comparable across processes
    worker.init_process_group()
    if ddp:
        model = worker.ddp(torch.nn.Linear(4, 1))
        model(torch.ones(2, 4)).sum().backward()
    dist.barrier()
    dist.destroy_process_group()


def time_start(world_size: int, start_method: str, ddp: bool = False) -> dict:
    """Launch ``world_size`` CPU workers with ``start_method``; ``{"ready": s, "joined": s}`` from the call."""
    with tempfile.TemporaryDirectory(prefix="course-startup-") as folder:
        start = time.time()
        launch(_worker, world_size, folder, ddp, device="cpu", start_method=start_method)
        joined = time.time() - start
        ready = max(float(p.read_text()) for p in Path(folder).glob("ready*")) - start
    return {"ready": ready, "joined": joined}


def compare_start_methods(world_sizes=(2, 4), ddp=(False, True), repeats: int = 1) -> list[dict]:
    """For each DDP setting and world size, both start methods alternately, ``repeats`` times each; one row per
    (ddp, world size, method) with the fastest ``ready`` and ``joined`` (the runs least disturbed by the rest
    of the machine)."""
    rows = []
    for with_ddp in ddp:
        for n in world_sizes:
            runs = {m: [] for m in METHODS}
            for _ in range(repeats):
                for m in METHODS:
                    runs[m].append(time_start(n, m, with_ddp))
            rows += [{"ddp": with_ddp, "world_size": n, "method": m, "ready": min(r["ready"] for r in runs[m]),
                      "joined": min(r["joined"] for r in runs[m])} for m in METHODS]
    return rows


def format_rows(rows: list[dict]) -> str:
    """The rows of :func:`compare_start_methods` as a table, with each method's *ready* over spawn's."""
    spawn = {(r["ddp"], r["world_size"]): r for r in rows if r["method"] == "spawn"}
    lines = [f"{'workers':>7}  {'DDP step':>8}  {'start method':<12}  {'ready (s)':>9}  {'joined (s)':>10}  "
             f"{'ready / spawn':>13}"]
    for r in rows:
        ratio = r["ready"] / spawn[(r["ddp"], r["world_size"])]["ready"]
        lines.append(f"{r['world_size']:>7}  {'yes' if r['ddp'] else 'no':>8}  {r['method']:<12}  "
                     f"{r['ready']:>9.2f}  {r['joined']:>10.2f}  {ratio:>13.0%}")
    return "\n".join(lines)


def time_scripts(world_size: int = 4, repeats: int = 1) -> dict:
    """The whole ``run_script`` of a small DDP script, cold (a fresh interpreter, spawned workers:
    ``COURSE_WARM=0``) and warm (the warm starter, forked workers); the fastest of ``repeats`` each, in s."""
    with tempfile.TemporaryDirectory(prefix="course-startup-") as folder:
        script = Path(folder, "one_step.py")
        script.write_text("import sys\nfrom helpers.startup import _worker\nfrom helpers.launch import launch\n"
                          "if __name__ == '__main__':  # spawned workers import this file\n"
                          f"    launch(_worker, {world_size}, sys.argv[1], True, device='cpu')\n")
        times = {"cold": [], "warm": []}
        for _ in range(repeats):
            for way, env in (("cold", {"COURSE_WARM": "0"}), ("warm", {})):
                times[way].append(run_script(script, folder, env=env, echo=False, timeout=300).seconds)
    return {way: min(t) for way, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3, help="each time is the fastest of this many runs")
    args = parser.parse_args()
    if args.repeats < 1 or min(args.world_sizes) < 1:
        parser.error("--repeats and every --world-sizes value must be integers >= 1")
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPU cores; "
          f"fastest of {args.repeats} runs each", flush=True)
    print(format_rows(compare_start_methods(args.world_sizes, (False, True), args.repeats)), flush=True)
    n = max(args.world_sizes)
    scripts = time_scripts(n, args.repeats)
    print(f"run_script of a {n}-worker script with one DDP step: fresh interpreter, spawned workers "
          f"{scripts['cold']:.2f} s; warm starter, forked workers {scripts['warm']:.2f} s "
          f"({scripts['warm'] / scripts['cold']:.0%})"
          + ("" if warm.usable() else ": no warm starter here (a GPU, or not Linux), so both ran the same cold path"))


if __name__ == "__main__":
    main()
