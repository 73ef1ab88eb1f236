"""The course's website, built from the executed lessons (``<out>/site/``: Sphinx, myst-nb, sphinx-book-theme, set
up in ``website/``): each page with its verification record, its solutions folded, its learner version offered
for download; launch links point at the course's repository when one is known (:func:`course_repository`), and
are left out when none is."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from helpers.lessons import NOTEBOOKS, WRITEFILE, is_check

WEBSITE = Path(__file__).resolve().parent.parent / "website"


INSTALL_BLANK = 'COURSE_REPOSITORY = ""'


def fill_repository(nb, repository: str | None) -> bool:
    """Write ``repository`` into the install cell's blank ``COURSE_REPOSITORY = ""``, so that the published copy
    clones it on Colab; True if it did. With no repository the blank stays, and the cell asks for one on Colab."""
    for cell in nb.cells if repository else []:
        if cell.cell_type == "code" and INSTALL_BLANK in cell.source:
            cell.source = cell.source.replace(INSTALL_BLANK, f'COURSE_REPOSITORY = "{repository}"', 1)
            return True
    return False


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
