"""The helpers package as a whole: no import circle between its modules, no module over about 400 lines, and
each public name the lessons call importable from where it lives."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
MOST_LINES = 420  # "about 400": a module past this holds two jobs


def module_name(path: Path, root: Path = HELPERS) -> str:
    name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def imports_of(path: Path, known: set[str], root: Path = HELPERS) -> set[str]:
    """The helpers modules that ``path`` imports, at its top or inside a function (an import inside a function is
    still a dependency: it runs the first time the function does)."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            candidates = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known)
    return found


def import_graph(root: Path = HELPERS) -> dict[str, set[str]]:
    """``{module: the helpers modules it imports}``; a package's ``__init__`` is left out as a dependency of the
    modules inside it (it runs first anyway), and so is the top package ``helpers``, which every module's import
    runs and which imports only :mod:`helpers.system`."""
    files = sorted(root.rglob("*.py"))
    names = {f: module_name(f, root) for f in files}
    known = set(names.values())
    return {me: {d for d in imports_of(f, known, root) if d != me and d != "helpers" and not me.startswith(d + ".")}
            for f, me in names.items()}


def first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first import circle found (``[a, b, a]``), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                return path[path.index(d):] + [d]
            if d not in state:
                cycle = visit(d)
                if cycle:
                    return cycle
        path.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_circle_and_none_where_there_is_none():
    assert first_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert first_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_a_circle_written_into_a_copy_of_the_package_is_found(tmp_path):
    """The walk reads real files: a copy of helpers/ in which the runner imports the checks, which run scripts
    through it (the shape of the circle this package had: launch and exercises importing each other), is caught."""
    import shutil

    copy = tmp_path / "helpers"
    shutil.copytree(HELPERS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    runner = copy / "runner.py"
    runner.write_text(runner.read_text() + "\n\ndef _again():\n    from helpers.exercises.checks import check\n")
    cycle = first_cycle(import_graph(copy))
    assert cycle and "helpers.runner" in cycle and "helpers.exercises.checks" in cycle, cycle


def test_helpers_has_no_import_circle():
    graph = import_graph()
    assert "helpers.launch" in graph and "helpers.exercises.checks" in graph
    assert first_cycle(graph) is None, " -> ".join(first_cycle(graph))


def test_no_module_of_helpers_holds_two_jobs():
    long = {module_name(f): n for f in HELPERS.rglob("*.py") if (n := len(f.read_text().splitlines())) > MOST_LINES}
    assert not long, f"modules over {MOST_LINES} lines: {long}"


@pytest.mark.parametrize("module, names", [
    ("helpers.launch", ["launch", "log", "pick_backend", "Placement", "Worker", "under_torchrun", "DEVICES"]),
    ("helpers.runner", ["run_script", "ScriptRun", "ScriptError", "ScriptTimeout", "running_children", "kill_group"]),
    ("helpers.diagnose", ["watch_ranks", "failure_line", "deadlock_line", "crash_line", "died_line",
                          "threads_line", "where_waiting"]),
    ("helpers.exercises", ["check", "check_script", "failure_of", "verdict", "first_difference", "summary",
                           "keep_going", "ExerciseFailed", "replace_solution", "stub", "solution", "exercises"]),
    ("helpers.lessons", ["notebook_scripts", "write_lesson_scripts"]),
    ("helpers.site", ["site", "course_repository"]),
    ("helpers.system", ["free_port", "socket_ifnames", "LOOPBACK"]),
])
def test_each_public_name_lives_where_the_lessons_import_it(module, names):
    loaded = importlib.import_module(module)
    missing = [n for n in names if not hasattr(loaded, n)]
    assert not missing, f"{module} lacks {missing}"


def test_each_room_imports_on_its_own_in_a_fresh_interpreter():
    """Importing one module first (as a worker script or a test may) works: no module needs another to have been
    imported before it, which is where a circle through a package's ``__init__`` would show. The rooms that import
    each other, each in an interpreter of its own, started together."""
    rooms = ["helpers.diagnose", "helpers.exercises.checks", "helpers.exercises.format", "helpers.launch",
             "helpers.runner", "helpers.site"]
    started = {room: subprocess.Popen([sys.executable, "-c", f"import {room}"], stderr=subprocess.PIPE, text=True,
                                      cwd=HELPERS.parent) for room in rooms}
    failed = {room: p.communicate(timeout=180)[1][-1500:] for room, p in started.items()}
    failed = {room: err for room, err in failed.items() if started[room].returncode}
    assert not failed, f"imported alone, these failed: {failed}"
