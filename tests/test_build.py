"""helpers.build (what `make course` runs) and the profile switch."""

import html
import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version

import nbformat
import pytest

import helpers
from helpers.launch import pick_backend

TITLE = "# 99 — A tiny lesson\n\nIt proves that zanzibar arithmetic holds, with $a = \\frac{1}{2}$.\n\n## The run"
LESSON = [
    "from helpers.metrics import run_dir\nfrom helpers.plots import plot_curves\nimport helpers",
    "out = run_dir('99_tiny/run')\nplot_curves({'a': ([0, 1], [1, 0])}, 'tiny', 'step', 'loss', "
    "path=out / 'tiny.png')\nprint('profile', helpers.course_profile())",
    # a child process writes to the terminal it inherited from the kernel, not to the notebook
    "import subprocess, sys\n"
    "subprocess.run([sys.executable, '-c', 'import sys; print(\"child noise\", file=sys.stderr)'])",
    "from helpers.launch import pick_backend\nprint('path:', pick_backend('auto', 2))",
    "%%writefile tiny_check.py\nassert True  # a script's assert: not a check cell of the lesson",
    "assert 1 + 1 == 2\nprint('checked')",
    "def double(x):\n    # Exercise 99a: twice x\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
    "from helpers.exercises import check\ncheck(\"99a\", lambda: None if double(3) == 6 else 'wrong')",
]


def write_lesson(folder, name, cells, title=None):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    if title:
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(title))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / name)


# the repository the tiny lesson's site links to (a build from a clone takes it from the clone's origin)
REPOSITORY = "https://github.com/example-course/dist-course"


def build(tmp_path, *flags, repository=REPOSITORY):
    """Run ``helpers.build`` on the lessons in ``tmp_path`` as ``make course`` does (full profile, whatever the
    profile of the tests that call it), with ``COURSE_REPOSITORY=repository``."""
    return subprocess.run([sys.executable, "-m", "helpers.build", "--out", str(tmp_path / "build"),
                           "--notebooks", str(tmp_path), *flags], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, COURSE_PROFILE="full", COURSE_REPOSITORY=repository))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One build of the tiny lesson, site included: ``(process result, output folder)``."""
    folder = tmp_path_factory.mktemp("tiny")
    write_lesson(folder, "99_tiny.ipynb", LESSON, TITLE)
    return build(folder), folder / "build"


@pytest.fixture(scope="module")
def no_repository(tiny, tmp_path_factory):
    """The tiny lesson's site built again from its executed notebook with no repository known: the output
    folder."""
    folder = tmp_path_factory.mktemp("no_repository")
    write_lesson(folder, "99_tiny.ipynb", LESSON, TITLE)
    (folder / "build").mkdir()
    shutil.copy(tiny[1] / "99_tiny.ipynb", folder / "build")
    done = build(folder, "--site-only", repository="")
    assert done.returncode == 0, done.stdout + done.stderr
    return folder / "build"


def test_build_writes_notebook_figures_logs_and_record(tiny):
    done, out = tiny
    assert done.returncode == 0, done.stdout + done.stderr
    executed = nbformat.read(out / "99_tiny.ipynb", as_version=4)
    assert any("profile" in o.get("text", "") for o in executed.cells[2].outputs)
    assert [p.name for p in (out / "figures" / "99_tiny").glob("*.png")] == ["99_tiny__run__tiny.png"]
    assert "child noise" not in done.stdout + done.stderr
    assert "child noise" in (out / "logs" / "99_tiny.log").read_text()
    assert re.search(r"^  99_tiny: cell 1/8, \d+ s$", done.stdout, re.M), "progress: which cell runs, since when"
    table = done.stdout.split("lesson ")[1]
    assert "99_tiny" in table and "no budget" in table
    record = executed.metadata["course"]
    assert (record["ok"], record["checks"], record["checks_ran"], record["checks_passed"]) == (True, 2, 2, 2)
    assert record["paths"] == [str(pick_backend("auto", 2))] and record["profile"] == "full"
    assert record["torch"].startswith(version("torch")) and f"{os.cpu_count()} CPU cores" in record["machine"]
    assert f"open {out / 'site' / 'index.html'}" in done.stdout


def words(page: str) -> str:
    """A page's text as a reader sees it: no tags, entities decoded, one space between words."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def site_pages(out):
    """The site's pages (not the HTML templates the themes leave among their assets in ``_static/``)."""
    return sorted((out / "site").glob("*.html"))


def test_site_links_all_resolve(tiny):
    _, out = tiny
    pages = site_pages(out)
    assert {"index.html", "99_tiny.html", "search.html"} <= {p.name for p in pages}
    ids = {}
    for page in pages:
        for link in re.findall(r'(?:href|src)="([^"]*)"', page.read_text()):
            if re.match(r"[a-z]+:", link) or link.startswith("data:"):
                continue  # http(s), mailto, javascript: not a file of the site
            target, _, anchor = link.split("?")[0].partition("#")
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), f"{page.name} links to missing {link}"
            if anchor and path.suffix == ".html":
                ids.setdefault(path, set(re.findall(r'id="([^"]+)"', path.read_text())))
                assert anchor in ids[path], f"{page.name} links to missing anchor {link}"
    index = (out / "site" / "index.html").read_text()
    assert 'href="99_tiny.html"' in index, "the home page and its sidebar list the lesson"
    assert re.search(r'<img[^>]+src="_images/99_tiny.png"', index), "the lesson map shows the lesson's figure"


def test_site_search_index_holds_the_lesson_words(tiny):
    _, out = tiny
    index = json.loads(re.fullmatch(r"Search.setIndex\((.*)\)\s*", (out / "site" / "searchindex.js").read_text(),
                                    re.S).group(1))
    lesson = index["docnames"].index("99_tiny")
    docs = index["terms"]["zanzibar"]  # one document's number, or a list of them
    assert lesson in (docs if isinstance(docs, list) else [docs])
    assert '<script src="searchindex.js"' in (out / "site" / "search.html").read_text(), \
        "the index loads as a script, which works from disk (a fetch would need a server)"


def test_site_lesson_page_has_verification_record_outputs_and_launch(tiny):
    _, out = tiny
    page = (out / "site" / "99_tiny.html").read_text()
    record = words(page[page.index("verification-record"):page.index("course-launch")])
    assert "Verified by its run" in record and "Checks 2 of 2 check cells ran, 2 passed" in record
    assert f"Device path {pick_backend('auto', 2)}" in record and "profile full" in record
    assert f"PyTorch {version('torch')}" in record
    assert "checked" in words(page) and "<math" in page, "outputs and formulas are on the page"
    assert page.index("verification-record") < page.index("zanzibar"), "the record is at the top"


def test_site_folds_solutions_and_offers_the_exercise_version(tiny):
    _, out = tiny
    page = (out / "site" / "99_tiny.html").read_text()
    assert "Show the solution of exercise 99a" in page and "Exercise 99a: correct" in page
    link = re.search(r'href="(_downloads/[^"]+/99_tiny\.ipynb)"', page)
    assert link, "no download link to the lesson's exercise version"
    learner = json.loads((out / "site" / html.unescape(link.group(1))).read_text())
    code = "".join("".join(c["source"]) for c in learner["cells"])
    assert "NotImplementedError('Exercise 99a (twice x)" in code and "return 2 * x" not in code


def test_site_links_to_the_repository_it_is_given(tiny):
    _, out = tiny
    page = (out / "site" / "99_tiny.html").read_text()
    launch = page[page.index("course-launch"):]
    assert ('href="https://colab.research.google.com/github/example-course/dist-course/blob/main/'
            'notebooks/99_tiny.ipynb"') in launch
    assert (f"git clone {REPOSITORY} && cd dist-course && make install && .venv/bin/jupyter lab "
            "notebooks/99_tiny.ipynb") in words(launch)
    assert f'href="{REPOSITORY}"' in page, "the theme's repository button"


def test_site_without_a_repository_shows_no_repository_link(no_repository):
    page = (no_repository / "site" / "99_tiny.html").read_text()
    assert "make install && .venv/bin/jupyter lab notebooks/99_tiny.ipynb" in words(page)
    for page in site_pages(no_repository):
        text = page.read_text()
        for link in ("colab.research.google.com", "git clone", "github.com/"):
            assert link not in text, f"{page.name} shows {link}"


def test_a_repository_that_is_no_public_address_is_refused_before_any_lesson_runs(tmp_path):
    write_lesson(tmp_path, "99_tiny.ipynb", LESSON)
    done = build(tmp_path, repository="example-course/dist-course")
    assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(
        "COURSE_REPOSITORY='example-course/dist-course': give the repository's public address, "
        "https://github.com/OWNER/NAME, or leave it empty for no repository links")
    assert not (tmp_path / "build").exists()


@pytest.mark.parametrize("origin, expected", [
    ("https://github.com/owner/course.git\n", "https://github.com/owner/course"),
    ("https://gitlab.com/owner/course", "https://gitlab.com/owner/course"),
    ("git@github.com:owner/course.git", "https://github.com/owner/course"),
    ("ssh://git@github.com/owner/course.git", "https://github.com/owner/course"),
    ("/work/main", None),  # a clone of a local checkout
    ("file:///work/main", None),
    ("https://user:token@github.com/owner/course.git", None),  # never published
    ("", None),  # no origin remote
])
def test_repository_comes_from_a_public_origin(origin, expected):
    from helpers.site import course_repository

    assert course_repository(environ={}, origin=origin) == expected


def test_course_repository_overrides_the_origin_and_empty_means_none():
    from helpers.site import course_repository

    origin = "git@github.com:owner/course.git"
    assert course_repository({"COURSE_REPOSITORY": "https://github.com/fork/course/"}, origin) == \
        "https://github.com/fork/course"
    assert course_repository({"COURSE_REPOSITORY": ""}, origin) is None


def test_no_page_has_the_default_author_line(tiny, no_repository):
    for out in (tiny[1], no_repository):
        for page in site_pages(out):
            text = page.read_text()
            assert "Author name not set" not in text and "component-author" not in text, page.name


def test_site_loads_nothing_from_the_network(tiny):
    _, out = tiny
    for page in site_pages(out):
        for tag in re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page.read_text()):
            assert not re.search(r'(?:src|href)="(?:https?:)?//', tag) or 'rel="search"' in tag, f"{page.name}: {tag}"
    for sheet in (out / "site").rglob("*.css"):
        assert not re.search(r"""(?:@import\s*|url\(\s*)["']?(?:https?:)?//""", sheet.read_text()), sheet.name


def test_budget_table_compares_each_lesson_with_its_budget():
    from helpers.build import budget_table

    rows = [dict(stem="00_orientation", seconds=50, ok=True), dict(stem="03_rl_rpc", seconds=450, ok=True),
            dict(stem="04_rnn", seconds=60, ok=False)]
    lines = budget_table(rows).splitlines()
    assert lines[1].split() == ["00_orientation", "0.8", "1", "within"]
    assert lines[2].split() == ["03_rl_rpc", "7.5", "7", "OVER"]
    assert lines[3].split()[-1] == "FAILED"
    assert lines[4].split() == ["all", "9.3", "11", "within"]


def test_failing_lesson_is_published_marked_failed_and_fails_the_build(tmp_path):
    write_lesson(tmp_path, "98_broken.ipynb", ["assert 1 + 1 == 2",
                                              "raise RuntimeError('lesson bug')", "assert 0 == 0"])
    done = build(tmp_path)
    assert done.returncode == 1
    assert "FAILED: RuntimeError: lesson bug" in done.stdout
    page = (tmp_path / "build" / "site" / "98_broken.html").read_text()
    record = words(page[page.index("verification-record"):page.index("course-launch")])
    assert "This run FAILED" in record and "RuntimeError: lesson bug" in record
    assert "1 of 2 check cells ran, 1 passed" in record
    assert "FAILED" in (tmp_path / "build" / "site" / "index.html").read_text()


def test_unknown_lesson_is_refused(tmp_path):
    write_lesson(tmp_path, "99_tiny.ipynb", LESSON)
    done = build(tmp_path, "--only", "42_nothing")
    assert done.returncode == 2 and "no lesson named 42_nothing" in done.stderr


def test_site_only_needs_executed_lessons(tmp_path):
    write_lesson(tmp_path, "99_tiny.ipynb", LESSON)
    done = build(tmp_path, "--site-only")
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"website: no executed lesson in {tmp_path / 'build'} to build the website from"]


@pytest.mark.parametrize("value, expected", [(None, "full"), ("full", "full"), ("quick", "quick")])
def test_profile_comes_from_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("COURSE_PROFILE", raising=False)
    else:
        monkeypatch.setenv("COURSE_PROFILE", value)
    assert helpers.course_profile() == expected


def test_unknown_profile_is_refused(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "fast")
    with pytest.raises(ValueError, match="COURSE_PROFILE='fast': set it to 'full' or 'quick'"):
        helpers.course_profile()


def record_paths(printed, machine_paths):
    """The ``paths`` of the record of a lesson whose one code cell printed ``printed``."""
    from helpers.build import record

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("run()")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    return record(nb, 1.0, "", dict(torch="2.14.1", cores=2, gpus=0, gpu="", paths=machine_paths))["paths"]


def test_record_names_the_path_a_lesson_states_as_well_as_placement_lines():
    placement = str(pick_backend("auto", 2))
    rpc = f"RPC over TensorPipe (TCP) with CPU tensors; {placement}"
    printed = (f"[rank 0] path: {placement}; float64\n"  # a placement line with more after it: the placement
               "[rank 0] path: the agent's policy on cpu, the observers on the CPU\n"  # an RPC lesson's roles
               f"[rank 0] path: {rpc}\n"  # a path line that names the placement after what it says of RPC
               f"[rank 1] path: {placement}\n"  # the same path again: recorded once
               "[node 1] [rank 0] path: two torchrun nodes\n"  # a worker's line behind its node's prefix
               "[default0]:path: torchrun's own prefix\n"
               "the run's path: not a path line\n")
    paths = record_paths(printed, [placement, "gloo on 9 GPUs"])
    assert paths == [placement, "the agent's policy on cpu, the observers on the CPU", rpc, "two torchrun nodes",
                     "torchrun's own prefix"], paths


def test_record_keeps_a_path_line_behind_the_label_of_its_run():
    # lesson 02's scaling cell prints each run's path line behind the run's name; a label alone is no path line
    placement = str(pick_backend("auto", 1))
    printed = f"1worker: [rank 0] path: {placement}; 1 thread\n2workers: [node 0] [rank 0] path: two nodes\n" \
              "note: path: a label without a worker's prefix\n"
    assert record_paths(printed, [placement]) == [placement, "two nodes"]


def test_record_holds_the_path_a_run_printed_not_a_preview_of_placements():
    # what a machine with one GPU prints: a table of the placements 1, 2 and 4 ranks would take, then one run
    placements = {n: str(pick_backend("auto", n, gpus=1)) for n in (1, 2, 4)}
    printed = ("placements on this machine:\n" + "".join(f"  {n} ranks: {p}\n" for n, p in placements.items())
               + f"two workers here take this path: {placements[2]}\n"
               + f"[rank 0] path: {placements[2]}; 3 steps\n[rank 0] loss 0.25\n")
    assert record_paths(printed, list(placements.values())) == [placements[2]]
    assert record_paths(printed.split("[rank 0]")[0], list(placements.values())) == [], "a preview is no path"


def test_progress_counts_code_cells_only():
    import io

    import nbformat

    from helpers.build import Progress

    progress = Progress("99_tiny", cells=2, stream=io.StringIO())
    progress.cell_started(cell=nbformat.v4.new_markdown_cell("# title"))
    progress.cell_started(cell=nbformat.v4.new_code_cell("   "))  # nbclient skips empty cells
    progress.cell_started(cell=nbformat.v4.new_code_cell("x = 1"))
    assert progress.line().startswith("  99_tiny: cell 1/2,")


def test_a_lesson_can_write_another_lessons_scripts(tmp_path):
    from helpers.lessons import notebook_scripts, write_lesson_scripts

    written = write_lesson_scripts("02_ddp.ipynb", tmp_path / "scripts")
    assert "ddp_mnist.py" in [p.name for p in written]
    assert (tmp_path / "scripts" / "ddp_mnist.py").read_text() == notebook_scripts("02_ddp.ipynb")["ddp_mnist.py"]
    write_lesson(tmp_path, "99_tiny.ipynb", LESSON[:4])
    assert write_lesson_scripts(tmp_path / "99_tiny.ipynb", tmp_path / "none") == []


def test_the_install_cell_gets_the_repository_only_when_one_is_known():
    from helpers.lessons import NOTEBOOKS
    from helpers.site import fill_repository

    nb = nbformat.read(NOTEBOOKS / "00_orientation.ipynb", as_version=4)
    assert not fill_repository(nb, None) and 'COURSE_REPOSITORY = ""' in nb.cells[1].source
    assert fill_repository(nb, "https://github.com/OWNER/NAME")
    install = next(c.source for c in nb.cells if c.cell_type == "code")
    assert 'COURSE_REPOSITORY = "https://github.com/OWNER/NAME"' in install and 'REPOSITORY = ""' not in install
