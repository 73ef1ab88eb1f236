"""Execute every lesson into a folder: executed notebooks, HTML, figures and an index page.

    python -m helpers.build --out build          # what `make course` runs

Each notebook runs in a fresh kernel with ``notebooks/`` as its working folder
and ``COURSE_RUNS=<out>/runs/<lesson>``, so its metrics and PNGs land there. A
failing lesson is still written out (with its error) and the command exits 1.
While a lesson runs, one line shows which cell it is in and for how long; at the
end a table gives each lesson's time against its budget.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
WRITEFILE = re.compile(r"^%%writefile\s+(?:-a\s+)?(\S+)\s*\n")
# minutes each lesson may take in the full profile on a 2-core CPU, by lesson number
BUDGET_MINUTES = {"00": 1, "01": 4, "02": 6, "03": 3, "04": 5, "05": 5, "06": 2, "07": 4, "08": 3}


def terminal_log(out: Path, stem: str) -> Path:
    """Where a lesson's kernel and its child processes write what does not go to the notebook."""
    return out / "logs" / f"{stem}.log"


def runs(cell) -> bool:
    """True for a cell that a kernel executes: a code cell with some source."""
    return cell["cell_type"] == "code" and bool("".join(cell["source"]).strip())


def notebook_scripts(notebook) -> dict[str, str]:
    """``{file name: source}`` of every ``%%writefile`` cell of a lesson, in cell order.

    ``notebook`` is a path, or a lesson's file name in ``notebooks/`` (e.g. ``"01_ddp.ipynb"``).
    """
    path = Path(notebook) if Path(notebook).is_file() else NOTEBOOKS / notebook
    scripts = {}
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        match = WRITEFILE.match(source)
        if cell["cell_type"] == "code" and match:
            scripts[Path(match.group(1)).name] = source[match.end():]
    return scripts


def write_lesson_scripts(notebook, folder="scripts") -> list[Path]:
    """Write a lesson's ``%%writefile`` scripts into ``folder``, as running its cells would; return their paths.

    Lets one lesson run another's scripts without the learner having run that lesson first.
    """
    written = []
    for name, source in notebook_scripts(notebook).items():
        written.append(Path(folder, name))
        written[-1].parent.mkdir(parents=True, exist_ok=True)
        written[-1].write_text(source)
    return written


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


def execute(notebook: Path, out: Path, cell_timeout: int) -> tuple[bool, float, str]:
    """Run ``notebook`` into ``out``, showing progress; return (succeeded, seconds, error line)."""
    import nbclient
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(notebook, as_version=4)
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
    nbformat.write(nb, out / notebook.name)
    body, _ = HTMLExporter().from_notebook_node(nb)
    (out / f"{notebook.stem}.html").write_text(body)
    return not error, seconds, error


def figures(out: Path, stem: str) -> list[Path]:
    """Copy the PNGs a lesson's runs saved into ``out/figures/<stem>/``; return their new paths."""
    dest = out / "figures" / stem
    shutil.rmtree(dest, ignore_errors=True)
    found = sorted((out / "runs" / stem).rglob("*.png"))
    dest.mkdir(parents=True, exist_ok=True)
    copies = []
    for png in found:
        copies.append(dest / "__".join(png.relative_to(out / "runs" / stem).parts))
        shutil.copy(png, copies[-1])
    return copies


def index_page(out: Path, rows: list[dict]) -> Path:
    """Write ``out/index.html`` linking each lesson's HTML, notebook and figures."""
    parts = ["<!doctype html><meta charset='utf-8'><title>Distributed PyTorch, hands-on</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
             "img{max-width:30em;border:1px solid #ccc;margin:.3em}</style>",
             "<h1>Distributed PyTorch, hands-on</h1>",
             f"<p>Profile <b>{html.escape(os.environ.get('COURSE_PROFILE', 'full'))}</b>, "
             f"built {time.strftime('%Y-%m-%d %H:%M')}.</p>"]
    for r in rows:
        status = "ok" if r["ok"] else f"FAILED: {html.escape(r['error'])}"
        parts.append(f"<h2><a href='{r['stem']}.html'>{r['stem']}</a></h2>"
                     f"<p>{status} · {r['seconds']:.0f} s · <a href='{r['stem']}.ipynb'>notebook</a></p>")
        parts += [f"<a href='{p.relative_to(out)}'><img src='{p.relative_to(out)}' alt='{p.name}'></a>"
                  for p in r["figures"]]
    page = out / "index.html"
    page.write_text("\n".join(parts))
    return page


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
    lines.append(f"{'all':<22} {total:>7.1f} {sum(budgets):>6}  {'within' if total <= sum(budgets) else 'OVER'}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build", help="output folder (default: build)")
    parser.add_argument("--only", nargs="*", default=None, help="lesson stems to run, e.g. 00_orientation")
    parser.add_argument("--cell-timeout", type=int, default=1800, help="seconds one cell may run")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="folder of NN_*.ipynb lessons")
    args = parser.parse_args()
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
    rows = []
    for nb in notebooks:
        print(f"running {nb.name} ...", flush=True)
        ok, seconds, error = execute(nb, out, args.cell_timeout)
        rows.append(dict(stem=nb.stem, ok=ok, seconds=seconds, error=error, figures=figures(out, nb.stem)))
        print(f"  {'ok' if ok else 'FAILED: ' + error} in {seconds:.0f} s, {len(rows[-1]['figures'])} figures; "
              f"kernel's terminal output in {terminal_log(out, nb.stem).relative_to(out.parent)}",
              flush=True)
    page = index_page(out, rows)
    print("\n" + budget_table(rows))
    print(f"\nOpen {page} (lessons as HTML, executed notebooks and figures in {out}).")
    if not all(r["ok"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
