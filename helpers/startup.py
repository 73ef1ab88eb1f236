"""How long :func:`helpers.launch.launch` takes to start its workers, with each start method.

    time_start(4, "forkserver")               # {"ready": s, "joined": s}, both from the call
    compare_start_methods((2, 4))             # one row per (ddp, world size, start method), methods interleaved
    python -m helpers.startup --repeats 3     # the table, for 2 and 4 workers, with and without a DDP step

*ready* is the moment the last worker entered its function (its process started, torch imported);
*joined* is when ``launch`` returned, after every worker joined a gloo process group, met the others at
a barrier (and, with ``ddp``, took one DDP step, whose first use imports ``torch._dynamo``) and exited.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.launch import PRELOAD, START_METHODS, default_start_method, launch


def _worker(worker, folder: str, ddp: bool) -> None:
    Path(folder, f"ready{worker.rank}").write_text(repr(time.time()))  # wall clock: comparable across processes
    worker.init_process_group()
    if ddp:
        model = worker.ddp(torch.nn.Linear(4, 1))
        model(torch.ones(2, 4)).sum().backward()
    dist.barrier()
    dist.destroy_process_group()


def time_start(world_size: int, start_method: str, ddp: bool = False) -> dict:
    """Launch ``world_size`` CPU workers with ``start_method``; return ``{"ready": s, "joined": s}`` from the call."""
    with tempfile.TemporaryDirectory(prefix="course-startup-") as folder:
        start = time.time()
        # what launch's forkserver would import for a script that does (or does not) use DDP
        preload = PRELOAD + (("torch._dynamo",) if ddp else ())
        launch(_worker, world_size, folder, ddp, device="cpu", start_method=start_method, preload=preload)
        joined = time.time() - start
        ready = max(float(p.read_text()) for p in Path(folder).glob("ready*")) - start
    return {"ready": ready, "joined": joined}


def compare_start_methods(world_sizes=(2, 4), ddp=(False,), repeats: int = 1) -> list[dict]:
    """Time each start method this system has for each world size (and DDP setting), alternating, ``repeats`` times.

    Returns one row per (ddp, world size, method): ``{"ddp", "world_size", "method", "ready", "joined"}``, each
    time the fastest of the repeats (the one least disturbed by whatever else ran on the machine).
    """
    methods = [m for m in START_METHODS if m in multiprocessing.get_all_start_methods()]
    rows = []
    for with_ddp in ddp:
        for n in world_sizes:
            runs = {m: [] for m in methods}
            for _ in range(repeats):
                for m in methods:
                    runs[m].append(time_start(n, m, with_ddp))
            rows += [{"ddp": with_ddp, "world_size": n, "method": m, "ready": min(r["ready"] for r in runs[m]),
                      "joined": min(r["joined"] for r in runs[m])} for m in methods]
    return rows


def format_rows(rows: list[dict]) -> str:
    """The rows of :func:`compare_start_methods` as a table, with each method's time over spawn's."""
    spawn = {(r["ddp"], r["world_size"]): r for r in rows if r["method"] == "spawn"}
    lines = [f"{'workers':>7}  {'DDP step':>8}  {'start method':<12}  {'ready (s)':>9}  {'joined (s)':>10}  "
             f"{'ready / spawn':>13}"]
    for r in rows:
        base = spawn.get((r["ddp"], r["world_size"]))
        ratio = f"{r['ready'] / base['ready']:.0%}" if base else "-"
        lines.append(f"{r['world_size']:>7}  {'yes' if r['ddp'] else 'no':>8}  {r['method']:<12}  "
                     f"{r['ready']:>9.2f}  {r['joined']:>10.2f}  {ratio:>13}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3, help="each time is the fastest of this many runs")
    args = parser.parse_args()
    if args.repeats < 1 or min(args.world_sizes) < 1:
        parser.error("--repeats and every --world-sizes value must be integers >= 1")
    print(f"torch {torch.__version__}; launch uses {default_start_method()}; fastest of {args.repeats} runs each",
          flush=True)
    print(format_rows(compare_start_methods(args.world_sizes, (False, True), args.repeats)))


if __name__ == "__main__":
    main()
