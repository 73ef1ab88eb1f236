"""``python -m helpers.exercises``: the learner's version of every lesson with exercises (``--out``, ``make
exercises``) or an nbgrader course directory (``--nbgrader``, ``make nbgrader``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from helpers.exercises.format import exercises, write_learner_notebooks
from helpers.exercises.nbgrader import write_nbgrader
from helpers.lessons import NOTEBOOKS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the learner's version of each lesson: "
                                                 "every exercise's solution replaced by a NotImplementedError.")
    parser.add_argument("--out", type=Path, default=Path("build/exercises"), help="folder to write them into")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="folder of the NN_*.ipynb lessons")
    parser.add_argument("--nbgrader", type=Path, metavar="DIR",
                        help="write an nbgrader course directory into DIR (source/<lesson>/, nbgrader_config.py)")
    parser.add_argument("--lessons", nargs="+", metavar="NN", help="with --nbgrader: only these lessons (e.g. 01 09)")
    parser.add_argument("--checks-only", action="store_true",
                        help="with --nbgrader: only the cells the checks need (autograding in seconds, not minutes)")
    args = parser.parse_args(argv)
    if not args.notebooks.is_dir():
        parser.error(f"no folder {args.notebooks}")
    if args.nbgrader:
        written = write_nbgrader(args.nbgrader, args.notebooks, args.lessons, args.checks_only)
        for path in written:
            print(f"{path}: nbgrader source of {path.parent.name}")
        print(f"then, in {args.nbgrader}: nbgrader generate_assignment <lesson>, collect the submissions into "
              "submitted/<student>/<lesson>/, nbgrader autograde <lesson>")
        return 0 if written else 1
    written = write_learner_notebooks(args.out, args.notebooks)
    for path in written:
        ids = [e for c in json.loads((args.notebooks / path.name).read_text())["cells"] if c["cell_type"] == "code"
               for e, _ in exercises("".join(c["source"]))]
        print(f"{path}: exercises {', '.join(ids)}")
    if not written:
        print(f"no lesson in {args.notebooks} has an exercise yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
