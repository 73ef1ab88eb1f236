# The two commands of the README, and the targets they use.
#   make course   install, then execute every notebook (full profile) into build/ and build the website,
#                 build/site/ (open build/site/index.html; `python -m helpers.build --site-only` rebuilds it alone)
#   make test     install, then run every test (quick profile, no download attempt), notebooks included, on two
#                 pytest workers (one on a 1-core machine): the lessons hold their checks with another running
#                 beside them; tests/conftest.py gives each worker half the notebooks, the longest items, first
#   make exercises  the learner's version of each lesson (solutions replaced by NotImplementedError), build/exercises/
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: course test exercises install lint clean

course: install
	COURSE_PROFILE=full $(PY) -m helpers.build --out build

test: install
	COURSE_PROFILE=quick COURSE_RUNS=$(CURDIR)/build/test-runs COURSE_OFFLINE=1 \
		$(PY) -m pytest notebooks tests --nbmake --nbmake-timeout=300 -n auto --maxprocesses 2 --dist worksteal --durations=15

exercises: install
	$(PY) -m helpers.exercises --out build/exercises

install: $(STAMP)

# Re-installs only when the pins or the package's declaration change.
$(STAMP): constraints.txt pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ needed, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned dependencies into $(VENV) (first time: about 2 minutes) ..."
	$(PY) -m pip install -qq --no-compile --constraint constraints.txt --editable ".[test,site]"
	@# pip would compile the bytecode file by file; compileall does the same on every core (-j 0). As pip
	@# does, it skips files that do not compile for this Python (torch ships one for Python 3.12 only).
	$(PY) -c 'import compileall, sys; compileall.compile_dir(sys.prefix + "/lib", quiet=2, workers=0)'
	touch $(STAMP)

lint: install
	$(PY) -m ruff check helpers tests notebooks data website

clean:
	rm -rf build notebooks/scripts runs notebooks/runs
