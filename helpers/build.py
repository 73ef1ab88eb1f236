"""Execute every lesson into a folder: executed notebooks, HTML, figures and an index page.

    python -m helpers.build --out build          # what `make course` runs

Each notebook runs in a fresh kernel with ``notebooks/`` as its working folder
and ``COURSE_RUNS=<out>/runs/<lesson>``, so its metrics and PNGs land there. A
failing lesson is still written out (with its error) and the command exits 1.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import sys
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def terminal_log(out: Path, stem: str) -> Path:
    """Where a lesson's kernel and its child processes write what does not go to the notebook."""
    return out / "logs" / f"{stem}.log"


def execute(notebook: Path, out: Path, cell_timeout: int) -> tuple[bool, float, str]:
    """Run ``notebook`` into ``out``; return (succeeded, seconds, error line)."""
    import nbclient
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(notebook, as_version=4)
    os.environ["COURSE_RUNS"] = str((out / "runs" / notebook.stem).resolve())
    client = nbclient.NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(notebook.parent)}})
    # what the kernel and its child processes write to the terminal rather than to the notebook (lesson
    # 00's deliberate spawn failure, say, whose children print tracebacks there) goes to a log file
    log = terminal_log(out, notebook.stem)
    log.parent.mkdir(parents=True, exist_ok=True)
    start, error = time.perf_counter(), ""
    try:
        with log.open("w") as terminal:
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
    print(f"\nOpen {page} (lessons as HTML, executed notebooks and figures in {out}).")
    if not all(r["ok"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
