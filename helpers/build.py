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
its budget. The site (``<out>/site/``: Sphinx, myst-nb, sphinx-book-theme, set
up in ``website/``) is built from every executed lesson in ``<out>``; its launch links point at the
course's repository when one is known (:func:`course_repository`), and are left out when none is.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
WEBSITE = Path(__file__).resolve().parent.parent / "website"
WRITEFILE = re.compile(r"^%%writefile\s+(?:-a\s+)?(\S+)\s*\n")
# minutes each lesson may take in the full profile on a 2-core CPU, by lesson number
BUDGET_MINUTES = {"00": 1, "01": 3, "02": 4, "03": 7, "04": 3, "05": 4, "06": 3, "07": 5, "08": 2, "09": 4,
                  "10": 3, "11": 3, "12": 5, "13": 2.5, "14": 3, "15": 4, "16": 4, "17": 4}


def terminal_log(out: Path, stem: str) -> Path:
    """Where a lesson's kernel and its child processes write what does not go to the notebook."""
    return out / "logs" / f"{stem}.log"


def runs(cell) -> bool:
    """True for a cell that a kernel executes: a code cell with some source."""
    return cell["cell_type"] == "code" and bool("".join(cell["source"]).strip())


def notebook_scripts(notebook) -> dict[str, str]:
    """``{file name: source}`` of every ``%%writefile`` cell of a lesson, in cell order.

    ``notebook`` is a path, or a lesson's file name in ``notebooks/`` (e.g. ``"02_ddp.ipynb"``).
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


INSTALL_BLANK = 'COURSE_REPOSITORY = ""'


def fill_repository(nb, repository: str | None) -> bool:
    """Write ``repository`` into the install cell's blank ``COURSE_REPOSITORY = ""``, so that the published copy
    clones it on Colab; True if it did. With no repository the blank stays, and the cell asks for one on Colab."""
    for cell in nb.cells if repository else []:
        if cell.cell_type == "code" and INSTALL_BLANK in cell.source:
            cell.source = cell.source.replace(INSTALL_BLANK, f'COURSE_REPOSITORY = "{repository}"', 1)
            return True
    return False


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


def public_repository(url: str) -> str | None:
    """``url`` as a public web address of a repository, ``https://host/owner/name``, or None.

    Takes what ``git remote get-url`` gives: ``https://host/owner/name(.git)``, ``git@host:owner/name(.git)``
    or ``ssh://git@host/owner/name(.git)``. A local path, a ``file:`` URL, or an address that carries a
    user name or a token (``https://user:token@host/...``) is not a public one: None.
    """
    url = url.strip()
    match = (re.fullmatch(r"https://([\w.-]+\.[a-z]{2,})/([\w.-]+)/([\w.-]+?)(?:\.git)?/?", url)
             or re.fullmatch(r"(?:ssh://)?git@([\w.-]+\.[a-z]{2,})[:/]([\w.-]+)/([\w.-]+?)(?:\.git)?/?", url))
    return "https://{}/{}/{}".format(*match.groups()) if match else None


def course_repository(environ=os.environ, origin: str | None = None) -> str | None:
    """The repository the launch links point at: ``COURSE_REPOSITORY`` when it is set (empty: none), else
    the checkout's ``origin`` remote when that is a public address (:func:`public_repository`), else None.

    ``origin`` stands in for ``git remote get-url origin`` (tests). A ``COURSE_REPOSITORY`` that is not a
    public address raises ValueError, in one line, rather than publishing links that lead nowhere.
    """
    if "COURSE_REPOSITORY" in environ:
        asked = environ["COURSE_REPOSITORY"].strip()
        if asked and not public_repository(asked):
            raise ValueError(f"COURSE_REPOSITORY={asked!r}: give the repository's public address, "
                             "https://github.com/OWNER/NAME, or leave it empty for no repository links")
        return public_repository(asked) if asked else None
    if origin is None:
        try:
            origin = subprocess.run(["git", "-C", str(NOTEBOOKS.parent), "remote", "get-url", "origin"],
                                    capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):  # no git here: no repository to link to
            origin = ""
    return public_repository(origin)


def is_check(cell) -> bool:
    """A check cell: a code cell that asserts or gives an exercise's verdict (not a ``%%writefile`` cell,
    whose asserts belong to a script)."""
    source = "".join(cell["source"])
    return runs(cell) and not WRITEFILE.match(source) and \
        re.search(r"^\s*(assert\b|(check|check_script|verdict)\()", source, re.M) is not None


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


def record_markdown(r: dict) -> str:
    """The verification record as the MyST box at the top of a lesson's page, followed by its launch links."""
    title = "Verified by its run" if r["checks"] else "Ran to the end (it has no check cell)"
    title = title if r["ok"] else "This run FAILED"
    lines = [f"````{{admonition}} {title}", f":class: {'tip' if r['ok'] else 'error'} verification-record",
             f"- **Ran** {r['date']}, profile `{r['profile']}`, in {r['seconds']:.0f} s",
             f"- **PyTorch** {r['torch']}, on {r['machine']}",
             "- **Device path**" + "".join(f"\n  - {path}" for path in r["paths"])
             + ("" if r["paths"] else " none: no run of this lesson printed a path line"),
             f"- **Checks** {r['checks_ran']} of {r['checks']} check cells ran, {r['checks_passed']} passed"
             + ("" if r["ok"] else "; the run stopped at this error:")]
    if not r["ok"]:
        lines += ["", "```text", r["error"], "```"]
    return "\n".join(lines + ["````", "", "```{course-launch}", "```"])


def fold_solutions(nb) -> list[str]:
    """Fold each exercise's solution cell of executed lesson ``nb`` on its page; return the exercises' ids."""
    from helpers.exercises import BEGIN, exercises

    ids = []
    for cell in nb.cells:
        if cell.cell_type == "code" and BEGIN in cell.source:
            found = [e for e, _ in exercises(cell.source)]
            ids += found
            cell.metadata.setdefault("tags", []).append("hide-input")
            script = WRITEFILE.match(cell.source)
            shown = (f"Show the whole script {Path(script.group(1)).name}, with the solution of exercise "
                     if script else "Show the solution of exercise ")
            cell.metadata["mystnb"] = {"code_prompt_show": shown + ", ".join(found),
                                       "code_prompt_hide": "Hide the script" if script else "Hide the solution"}
    return ids


def tidy_outputs(nb) -> None:
    """On a page, one box per stream of a cell (a run prints line by line, and each line was an output of its
    own) and one verdict per check (a check cell's value repeats the verdict line it printed: not shown)."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream" \
                    and merged[-1].get("name") == output.get("name"):
                merged[-1]["text"] = "".join(merged[-1]["text"]) + "".join(output["text"])
                continue
            verdict = "".join(output.get("data", {}).get("text/plain", "")) if output.get("output_type") == \
                "execute_result" else ""
            if is_check(cell) and re.fullmatch(r"""(['"])Exercise \d\d[a-z]: .*\1""", verdict.strip(), re.S):
                continue
            merged.append(output)
        cell["outputs"] = merged


def exercises_markdown(name: str, ids: list[str]) -> str:
    """The line that offers a lesson's learner version (``_exercises/<name>``) for download."""
    return (f"**Exercises** {', '.join(ids)}: each solution below is folded, with its check's verdict after it. "
            f"To write them yourself, {{download}}`download the exercise version of this lesson <_exercises/{name}>` "
            "(every solution replaced by a `NotImplementedError`), save it in a folder of the course outside "
            "`notebooks/` (`make test` runs every notebook there), such as `build/exercises/`, and run it there: each "
            "check prints its verdict and the run goes on, and its last cell lists your exercises, passed or not.")


def lesson_source(nb, name: str, src: Path) -> tuple[str, str]:
    """Write executed lesson ``nb`` as ``src/name``, its record under its title; return (title, first PNG in base64).

    Exercise solutions are folded, and when ``src/_exercises/name`` (its learner version) exists the page
    offers it for download.
    """
    import nbformat

    title, rest = Path(name).stem, ""
    if nb.cells and nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "):
        heading, _, rest = nb.cells[0].source.partition("\n")
        nb.cells[0].source, title = heading, heading[2:].strip()
    ids = fold_solutions(nb)
    tidy_outputs(nb)
    offer = [exercises_markdown(name, ids)] if ids and (src / "_exercises" / name).is_file() else []
    nb.cells[1:1] = [nbformat.v4.new_markdown_cell(m) for m in [record_markdown(nb.metadata["course"]), *offer]] + (
        [nbformat.v4.new_markdown_cell(rest.strip())] if rest.strip() else [])
    nbformat.write(nb, src / name)
    images = [o["data"]["image/png"] for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    return title, images[0] if images else ""


def site(out: Path, notebooks: Path = NOTEBOOKS) -> Path:
    """Build ``out/site/`` from the executed lessons in ``out`` (those with a record); return its home page.

    The learner versions offered for download are made from the lessons in ``notebooks``.
    """
    import nbformat

    work = out / "site-work"  # the pages' sources and Sphinx's scratch folders, kept to debug a build
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src"
    (src / "_figures").mkdir(parents=True)
    from helpers.exercises import write_learner_notebooks

    write_learner_notebooks(src / "_exercises", notebooks)  # from the committed lessons: what a learner downloads
    executed = {p: nbformat.read(p, as_version=4) for p in sorted(out.glob("[0-9][0-9]_*.ipynb"))}
    executed = {p: nb for p, nb in executed.items() if "course" in nb.metadata}  # run by this command
    if not executed:
        raise RuntimeError(f"no executed lesson in {out} to build the website from")
    records = [nb.metadata["course"] for nb in executed.values()]
    lessons = ["```{toctree}\n:hidden:\n:caption: Lessons\n\n" + "".join(f"{p.stem}\n" for p in executed) + "```\n"]
    for path, nb in executed.items():
        r = nb.metadata["course"]
        title, figure = lesson_source(nb, path.name, src)
        status = (f"ran in {r['seconds'] / 60:.1f} min, {r['checks_passed']} of {r['checks']} check cells passed"
                  if r["ok"] else f"**FAILED**: {r['error']}")
        lessons.append(f"### [{title}]({path.name})\n\n{status}\n")
        if figure:
            (src / "_figures" / f"{path.stem}.png").write_bytes(base64.b64decode(figure))
            lessons.append(f"```{{image}} _figures/{path.stem}.png\n:class: lesson-figure\n"
                           f":alt: the first figure of {path.stem}\n:target: {path.stem}.html\n```\n")
    built = (f"This build: {len(records)} lessons run in the `{records[0]['profile']}` profile with PyTorch "
             f"{records[0]['torch']} on {records[0]['machine']}; {sum(r['ok'] for r in records)} ran to the end, "
             f"and {sum(r['checks_passed'] for r in records)} of {sum(r['checks'] for r in records)} check cells "
             f"passed. Pages built {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
    home = (WEBSITE / "index.md").read_text().replace("% LESSON MAP", "\n".join(lessons))
    (src / "index.md").write_text(home.replace("% BUILD RECORD", built))
    from sphinx.cmd.build import build_main

    code = build_main(["-q", "-E", "-b", "html", "-c", str(WEBSITE), "-d", str(work / "doctrees"),
                       str(src), str(work / "html")])  # myst-nb puts its own scratch next to html/
    if code:
        raise RuntimeError(f"the website build failed (sphinx exit code {code}); its messages are above")
    shutil.rmtree(out / "site", ignore_errors=True)
    (work / "html").rename(out / "site")
    return out / "site" / "index.html"


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
