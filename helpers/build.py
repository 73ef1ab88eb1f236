"""Execute every lesson into a folder, then build the course's website from the executed notebooks.

    python -m helpers.build --out build          # what `make course` runs
    python -m helpers.build --out build --site-only   # the website again, from the lessons already run

Each notebook runs in a fresh kernel with ``notebooks/`` as its working folder
and ``COURSE_RUNS=<out>/runs/<lesson>``, so its metrics and PNGs land there. The
executed notebook carries its verification record (date, torch, device path,
profile, time, check cells run and passed) in its metadata under ``course``.
A failing lesson is still written out (with its error, marked failed on its
page) and the command exits 1. While a lesson runs, one line shows which cell
it is in and for how long; at the end a table gives each lesson's time against
its budget. The site (:mod:`helpers.site`) is built from every executed lesson in ``<out>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from helpers import warm
from helpers.lessons import NOTEBOOKS, is_check, runs
from helpers.site import course_repository, figures, fill_repository, site

# minutes each lesson may take in the full profile on a 2-core CPU, by lesson number
BUDGET_MINUTES = {"00": 1, "01": 3, "02": 4, "03": 7, "04": 3, "05": 4, "06": 3, "07": 5, "08": 2, "09": 4,
                  "10": 3, "11": 3, "12": 5, "13": 2.5, "14": 3, "15": 4, "16": 4, "17": 4}


def terminal_log(out: Path, stem: str) -> Path:
    """Where a lesson's kernel and its child processes write what does not go to the notebook."""
    return out / "logs" / f"{stem}.log"


class Progress:
    """One line, rewritten in place on a terminal, saying which code cell of a lesson runs and since when.

    Elsewhere (a log, CI) it prints such a line when a cell starts, at most once every ``every`` seconds.
    """

    def __init__(self, stem: str, cells: int, stream=None, every: float = 30.0):
        self.stem, self.cells, self.stream, self.every = stem, cells, stream or sys.stdout, every
        self.tty = self.stream.isatty()
        self.cell, self.start, self.last_print = 0, time.perf_counter(), -float("inf")
        self.done = threading.Event()

    def line(self) -> str:
        return f"  {self.stem}: cell {self.cell}/{self.cells}, {time.perf_counter() - self.start:.0f} s"

    def cell_started(self, cell=None, **_) -> None:
        if cell is not None and not runs(cell):  # nbclient calls this for markdown and empty cells too
            return
        self.cell += 1
        if not self.tty and time.perf_counter() - self.last_print >= self.every:
            self.last_print = time.perf_counter()
            print(self.line(), file=self.stream, flush=True)

    def __enter__(self):
        if self.tty:
            threading.Thread(target=self._refresh, daemon=True).start()
        return self

    def __exit__(self, *_):
        self.done.set()
        if self.tty:
            print("\r\x1b[K", end="", file=self.stream, flush=True)

    def _refresh(self) -> None:
        while not self.done.wait(1.0):
            print("\r\x1b[K" + self.line(), end="", file=self.stream, flush=True)


def execute(notebook: Path, out: Path, cell_timeout: int, machine: dict) -> tuple[bool, float, str]:
    """Run ``notebook`` into ``out`` with its record (:func:`record`), showing progress; return (ok, seconds, error).
    The executed copy's install cell names the course's repository where one is known (:func:`fill_repository`)."""
    import nbclient
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    fill_repository(nb, course_repository())
    os.environ["COURSE_RUNS"] = str((out / "runs" / notebook.stem).resolve())
    progress = Progress(notebook.stem, sum(map(runs, nb.cells)))
    client = nbclient.NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(notebook.parent)}},
                                     on_cell_start=progress.cell_started)
    # what the kernel and its child processes write to the terminal rather than to the notebook (lesson
    # 00's deliberate spawn failure, say, whose children print tracebacks there) goes to a log file
    log = terminal_log(out, notebook.stem)
    log.parent.mkdir(parents=True, exist_ok=True)
    start, error = time.perf_counter(), ""
    try:
        with log.open("w") as terminal, progress:
            client.execute(stdout=terminal, stderr=terminal)
    except nbclient.exceptions.CellExecutionError as e:
        error = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()[-1]  # no terminal colours
    except nbclient.exceptions.CellTimeoutError:
        error = f"a cell ran past {cell_timeout} s"
    seconds = time.perf_counter() - start
    nb.metadata["course"] = record(nb, seconds, error, machine)
    nbformat.write(nb, out / notebook.name)
    return not error, seconds, error


# Run in a fresh interpreter, so that this process never imports torch nor touches a GPU the lessons need.
# Every line Placement can print for this machine, to recognise one inside a run's path line (see record).
PROBE = """
import json, os, torch
from helpers.launch import DEVICES, pick_backend
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
paths = set()
for ranks in range(1, 65):
    for device in DEVICES:
        for share in (True, False):
            try:
                paths.add(str(pick_backend("auto", ranks, device=device, share_gpus=share)))
            except (ValueError, TypeError):
                pass
print(json.dumps(dict(torch=torch.__version__, cores=os.cpu_count(), gpus=gpus,
                      gpu=torch.cuda.get_device_name(0) if gpus else "", paths=sorted(paths))))
"""


def probe_machine() -> dict:
    """``{torch, cores, gpus, gpu (the first GPU's name), paths (the placement lines possible here)}``."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                          cwd=NOTEBOOKS.parent)
    return json.loads(done.stdout.splitlines()[-1])


def record(nb, seconds: float, error: str, machine: dict) -> dict:
    """The verification record of an executed lesson: what ran where, how long, and which checks passed.

    ``paths`` are the path lines the lesson's runs printed, in order of first appearance: lines that begin
    ``path: `` after the prefixes a run puts before its workers' lines (``[rank N] ``, ``[node N] [rank N] ``,
    torchrun's ``[default0]:``), and after a lesson's label of the run in front of those (``1worker: [rank 0] ``,
    where a cell prints which of its runs a worker's path line came from). A line that begins with a placement line of
    ``helpers.launch.Placement`` records that placement (what follows it describes the run, not the path);
    any other records its text, as RPC lessons say what crosses RPC and where each role computes. A
    placement printed anywhere else (a preview of what N ranks would take, a table of possible placements)
    is not a path any run took, and is not recorded.
    """
    printed = "".join(o.get("text", "") for c in nb.cells if c["cell_type"] == "code" for o in c.get("outputs", []))
    found = []
    for stated in re.findall(r"^(?:[\w.-]+: (?=\[))?(?:\[[^\]\n]+\]:? ?)*path: (.+?)\s*$", printed, re.M):
        path = next((p for p in sorted(machine["paths"], key=len, reverse=True) if stated.startswith(p)), stated)
        if path not in found:
            found.append(path)
    checks = [c for c in nb.cells if is_check(c)]
    ran = [c for c in checks if c.get("execution_count") is not None]
    passed = [c for c in ran if not any(o["output_type"] == "error" for o in c.get("outputs", []))]
    gpus = f"{machine['gpus']} x {machine['gpu']}" if machine["gpus"] else "no GPU"
    return dict(ok=not error, error=error, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                torch=machine["torch"], machine=f"{machine['cores']} CPU cores, {gpus}", paths=found,
                profile=os.environ.get("COURSE_PROFILE", "full"), seconds=round(seconds, 1),
                checks=len(checks), checks_ran=len(ran), checks_passed=len(passed))


def budget_table(rows: list[dict]) -> str:
    """Each lesson's minutes against its budget (:data:`BUDGET_MINUTES`), and the total, as a text table."""
    lines = [f"{'lesson':<22} {'minutes':>7} {'budget':>6}  verdict"]
    for r in rows:
        budget = BUDGET_MINUTES.get(r["stem"][:2])
        verdict = "no budget" if budget is None else ("within" if r["seconds"] <= 60 * budget else "OVER")
        lines.append(f"{r['stem']:<22} {r['seconds'] / 60:>7.1f} {budget if budget else '-':>6}  "
                     f"{verdict if r['ok'] else 'FAILED'}")
    total = sum(r["seconds"] for r in rows) / 60
    budgets = [BUDGET_MINUTES.get(r["stem"][:2], 0) for r in rows]
    verdict = "no budget" if not sum(budgets) else ("within" if total <= sum(budgets) else "OVER")
    lines.append(f"{'all':<22} {total:>7.1f} {sum(budgets):>6}  {verdict}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build", help="output folder (default: build)")
    parser.add_argument("--only", nargs="*", default=None, help="lesson stems to run, e.g. 00_orientation")
    parser.add_argument("--cell-timeout", type=int, default=1800, help="seconds one cell may run")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="folder of NN_*.ipynb lessons")
    parser.add_argument("--site-only", action="store_true", help="run no lesson: build the site from <out>")
    args = parser.parse_args()
    try:  # the site's launch links need it: a wrong one is refused now, not after every lesson has run
        course_repository()
    except ValueError as e:
        parser.error(str(e))
    notebooks = sorted(args.notebooks.glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        parser.error(f"no lessons (NN_*.ipynb) in {args.notebooks}")
    if args.only:
        unknown = set(args.only) - {nb.stem for nb in notebooks}
        if unknown:
            parser.error(f"no lesson named {', '.join(sorted(unknown))}")
        notebooks = [nb for nb in notebooks if nb.stem in args.only]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows, machine = [], None if args.site_only else probe_machine()
    if not args.site_only and not os.environ.get(warm.SHARED):  # (a build under make test: the tests' starter)
        warm.share()  # one starter for every lesson's kernel, instead of one each that imports torch again
    for nb in [] if args.site_only else notebooks:
        print(f"running {nb.name} ...", flush=True)
        ok, seconds, error = execute(nb, out, args.cell_timeout, machine)
        rows.append(dict(stem=nb.stem, ok=ok, seconds=seconds, error=error, figures=figures(out, nb.stem)))
        print(f"  {'ok' if ok else 'FAILED: ' + error} in {seconds:.0f} s, {len(rows[-1]['figures'])} figures; "
              f"kernel's terminal output in {terminal_log(out, nb.stem).relative_to(out.parent)}",
              flush=True)
    if rows:
        print("\n" + budget_table(rows))
    start = time.perf_counter()
    try:
        page = site(out, args.notebooks)
    except RuntimeError as e:
        sys.exit(f"website: {e}")
    print(f"\nwebsite built in {time.perf_counter() - start:.0f} s: open {page} "
          f"(executed notebooks, figures and logs in {out}).")
    if not all(r["ok"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
