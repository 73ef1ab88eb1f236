# The two commands of the README, and the targets they use.
#   make course   install, then execute every notebook (full profile) into build/ and build the website,
#                 build/site/ (open build/site/index.html; `python -m helpers.build --site-only` rebuilds it alone)
#   make test     install, then run every test (quick profile, no download attempt), notebooks included, on two
#                 pytest workers (one on a 1-core machine): the lessons hold their checks with another running
#                 beside them; tests/conftest.py gives each worker half the notebooks, the longest items, first
#   make test-floor the same tests and lessons with the oldest PyTorch the course supports (constraints-floor.txt,
#                 helpers.TORCH_FLOOR), installed into .venv-floor; .ci/run runs it after make test
#   make exercises  the learner's version of each lesson (solutions replaced by NotImplementedError), build/exercises/
#   make nbgrader   an nbgrader course directory of the lessons with exercises, build/nbgrader/ (README, Exercises)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
FLOOR_VENV  := .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed-stamp
# the packages whose pins constraints-floor.txt replaces: torch and what its wheel brings along
TORCH_FAMILY := ^(torch|torchvision|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==
# every test and every lesson in the quick profile, with the Python of the environment given as $(1)
TESTS = COURSE_PROFILE=quick COURSE_RUNS=$(CURDIR)/build/$(2) COURSE_OFFLINE=1 \
		$(1) -m pytest notebooks tests --nbmake --nbmake-timeout=300 -n auto --maxprocesses 2 --dist worksteal --durations=15

# byte-compile a venv's modules on every core (as pip would one by one), less what nothing imports
COMPILE = import compileall, re, sys; compileall.compile_dir(sys.prefix + "/lib", quiet=2, workers=0, \
	rx=re.compile(r"/(tests?|pip|setuptools)/"))
# with the venv's Python $(1), after .ci/preinstall.py: pip install the course against the constraints $(2), the
# bytecode compiled beside it (see the install's comments); fails if either does
PIP_AND_COMPILE = $(1) -c '$(COMPILE)' & compiling=$$!; \
	$(1) -m pip install -qq --no-compile --constraint $(2) --editable ".[test,site]"; installed=$$?; \
	wait $$compiling && exit $$installed

.PHONY: course test test-floor exercises nbgrader install install-floor lint clean

course: install
	COURSE_PROFILE=full $(PY) -m helpers.build --out build

test: install
	$(call TESTS,$(PY),test-runs)

test-floor: install-floor
	$(call TESTS,$(FLOOR_VENV)/bin/python,test-runs-floor)

exercises: install
	$(PY) -m helpers.exercises --out build/exercises

nbgrader: install
	$(PY) -m helpers.exercises --nbgrader build/nbgrader

install: $(STAMP)
install-floor: $(FLOOR_STAMP)

# Re-installs only when the pins or the package's declaration change.
$(STAMP): constraints.txt pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ needed, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned dependencies into $(VENV) (first time: about a minute here) ..."
	@# the pins first, in several pip runs at once (.ci/preinstall.py: Linux x86_64 and Python 3.11 only, as the pins)
	$(PY) .ci/preinstall.py constraints.txt
	@# pip would compile the bytecode file by file; compileall does the same on every core (-j 0), beside the
	@# pip install below, which finds the pins installed (bytecode records its source's time stamp and size:
	@# a file pip writes meanwhile is compiled again as it is imported). As pip does, compileall skips files that
	@# do not compile for this Python (torch ships one for Python 3.12 only). Left out: the packages' own
	@# test suites and pip's and setuptools' sources, which nothing here imports.
	$(call PIP_AND_COMPILE,$(PY),constraints.txt)
	touch $(STAMP)

# The same install with the floor's torch family: constraints.txt less those lines, plus constraints-floor.txt.
$(FLOOR_STAMP): constraints.txt constraints-floor.txt pyproject.toml
	$(PYTHON) -m venv $(FLOOR_VENV)
	grep -vE '$(TORCH_FAMILY)' constraints.txt > $(FLOOR_VENV)/constraints.txt
	grep -E '$(TORCH_FAMILY)' constraints-floor.txt >> $(FLOOR_VENV)/constraints.txt
	@echo "Installing the floor's PyTorch and the other pins into $(FLOOR_VENV) ..."
	$(FLOOR_VENV)/bin/python .ci/preinstall.py $(FLOOR_VENV)/constraints.txt
	$(call PIP_AND_COMPILE,$(FLOOR_VENV)/bin/python,$(FLOOR_VENV)/constraints.txt)
	touch $(FLOOR_STAMP)

lint: install
	$(PY) -m ruff check helpers tests notebooks data website

clean:
	rm -rf build notebooks/scripts runs notebooks/runs
