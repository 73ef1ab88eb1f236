"""An nbgrader course directory of the lessons with exercises (``make nbgrader``): each solution cell, each
locked graded check cell, every other code cell locked; ``checks_only`` keeps just what the checks need."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from helpers.exercises.format import BEGIN, exercises
from helpers.lessons import NOTEBOOKS

# --- an nbgrader course directory -------------------------------------------------------------------------------

CHECK_CALL = re.compile(r"""^\s*(?:\w+\s*=\s*)?(?:check|check_script)\(\s*["'](\d\d[a-z])["']""", re.M)


NBGRADER_CONFIG = """# Written by `python -m helpers.exercises --nbgrader`: the lessons as nbgrader assignments.
c = get_config()  # noqa: F821 (nbgrader's config loader defines it)
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = "distributed-pytorch-hands-on"
c.ExecutePreprocessor.timeout = 900  # a check cell runs a script of several ranks
c.Execute.timeout = 900
"""


def _statement_names(node) -> tuple[set, set]:
    """(names a statement defines, names it reads)."""

    defined, used = set(), set()
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
        defined.add(node.name)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (defined if isinstance(sub.ctx, ast.Store) else used).add(sub.id)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in sub.names}
    return defined, used


SETUP_MODULES = {"os", "sys", "warnings", "logging", "torch", "random", "np"}


def _trim(source: str, wanted: set) -> tuple[str | None, set]:
    """The statements of a cell that the cells after it need: those defining a name in ``wanted``, imports, and
    calls into a module that set things up (``os.makedirs(...)``, ``sys.path.insert(...)``);
    ``(None, wanted)`` when none is needed, else ``(their source, wanted as it stands before the cell)``. A cell
    Python cannot parse (IPython's ``!`` and ``%`` lines) is kept whole."""

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source, wanted
    lines, kept = source.splitlines(keepends=True), []
    for node in reversed(tree.body):
        defined, used = _statement_names(node)
        call = node.value.func if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else None
        while isinstance(call, ast.Attribute):
            call = call.value
        plain = isinstance(call, ast.Name) and call.id in SETUP_MODULES  # os.makedirs(...), torch.manual_seed(...)
        if defined & wanted or isinstance(node, (ast.Import, ast.ImportFrom)) or plain:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.insert(0, "".join(lines[first - 1:node.end_lineno]))
            wanted = (wanted - defined) | used
    return ("".join(kept) if kept else None), wanted


def _free_names(source: str) -> set:
    """The names a cell reads before (or without) defining them."""

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    wanted = set()
    for node in reversed(tree.body):
        defined, used = _statement_names(node)
        wanted = (wanted - defined) | used
    return wanted


def nbgrader_notebook(path: Path, checks_only: bool = False) -> dict | None:
    """Lesson ``path`` as an nbgrader source notebook, or None when it has no exercise.

    Each cell holding a solution region is a solution cell; each cell that calls ``check``/``check_script`` for
    an exercise is a graded test cell (1 point, locked: it passes when the check raises nothing); every other
    code cell is locked (read-only). ``checks_only`` keeps only what the checks need: the title, the
    exercises' text, the ``%%writefile`` cells, and the code cells that define a name a kept cell reads.
    """
    nb = json.loads(Path(path).read_text())
    cells = nb["cells"]
    kinds = []
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code":
            kinds.append("markdown")
        elif BEGIN in source:
            kinds.append("solution")
        elif CHECK_CALL.search(source):
            kinds.append("test")
        else:
            kinds.append("code")
    if "solution" not in kinds:
        return None
    keep = [True] * len(cells)
    if checks_only:
        wanted, keep = set(), [False] * len(cells)
        for i in reversed(range(max(i for i, k in enumerate(kinds) if k == "test") + 1)):
            source = "".join(cells[i]["source"])
            if kinds[i] == "markdown":
                keep[i] = i == 0 or re.search(r"\*\*Exercise \d\d[a-z]", source) is not None
            elif WRITEFILE_CELL.match(source) or kinds[i] == "solution":  # a script: its names are not the notebook's
                keep[i] = True
            elif kinds[i] == "test":
                keep[i] = True
                wanted |= _free_names(source)
            else:
                trimmed, wanted = _trim(source, wanted)
                if trimmed is not None:
                    keep[i] = True
                    cells[i]["source"] = trimmed.splitlines(keepends=True)
    stem = Path(path).stem
    out = []
    for i, (cell, kind) in enumerate(zip(cells, kinds, strict=True)):
        if not keep[i]:
            continue
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            source = "".join(cell["source"])
            ids = [e for e, _ in exercises(source)] if kind == "solution" else CHECK_CALL.findall(source)
            grade_id = {"solution": f"{'-'.join(ids)}-solution", "test": f"{'-'.join(ids)}-check"}.get(
                kind, f"{stem[:2]}-cell-{i}")
            meta = {"grade": kind == "test", "grade_id": grade_id, "locked": kind != "solution",
                    "schema_version": 3, "solution": kind == "solution", "task": False}
            if kind == "test":
                meta["points"] = len(ids)
            cell["metadata"]["nbgrader"] = meta
        out.append(cell)
    nb["cells"] = out
    return nb


WRITEFILE_CELL = re.compile(r"^%%writefile\s")


def write_nbgrader(out: Path, notebooks: Path = NOTEBOOKS, lessons: list[str] | None = None,
                   checks_only: bool = False) -> list[Path]:
    """Write an nbgrader course directory into ``out``: ``nbgrader_config.py`` and ``source/<lesson>/<lesson>.ipynb``
    for every lesson with exercises (or those whose number is in ``lessons``); return the notebooks written."""
    out = Path(out).resolve()
    written = []
    for path in sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb")):
        if lessons and path.name[:2] not in lessons:
            continue
        nb = nbgrader_notebook(path, checks_only)
        if nb is None:
            continue
        folder = out / "source" / path.stem
        folder.mkdir(parents=True, exist_ok=True)
        written.append(folder / path.name)
        written[-1].write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    (out / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(root=str(out)))
    return written
