"""Install the pinned packages of a constraints file into this Python's environment in parallel pip runs.

    python .ci/preinstall.py constraints.txt   # run with the venv's Python, before `pip install -e .[test,site]`

One pip run looks up, downloads and unpacks its ~200 packages one after another, waiting on the index for
each lookup; a few runs side by side, each with a share of the pins and no dependency resolution
(`--no-deps`: the pins are the whole resolved set), take about two thirds of the time (measured on a 2-core
machine with the wheels read before: 66 s for one pip run; 35 s for 5 runs, then 9 s for the pip install after).
The `pip install` that follows stays the authority: it resolves against the same constraints, finds the pins
installed, and installs what is missing or different.

The pins are the resolved set for Linux x86_64 and the Python version they were made with (the NVIDIA
wheels exist only there): elsewhere this does nothing, and the plain `pip install` installs everything.
"""

import platform
import re
import subprocess
import sys
from pathlib import Path

RUNS = 5  # pip runs at once: they wait on the index more than they compute
PINNED_FOR = ("linux", "x86_64", (3, 11))  # what constraints.txt was resolved on (its first line says so)


def groups(pins: list[str], runs: int) -> list[list[str]]:
    """The NVIDIA wheels (half the bytes, one namespace folder) in one run, torch (the largest wheel)
    alone in another, the rest dealt among the others, triton (the next largest) first."""
    nvidia = [p for p in pins if p.startswith(("nvidia-", "cuda-"))]
    torch = [p for p in pins if p.startswith("torch==")]
    rest = sorted((p for p in pins if p not in nvidia + torch), key=lambda p: not p.startswith("triton=="))
    shares = [nvidia, torch] + [rest[i::runs - 2] for i in range(runs - 2)]
    return [share for share in shares if share]


def main(constraints: str) -> int:
    here = (sys.platform, platform.machine(), sys.version_info[:2])
    if here != PINNED_FOR:
        print(f"preinstall: the pins are for {PINNED_FOR}, this is {here}: left to pip install")
        return 0
    pins = [line.split("#")[0].strip() for line in Path(constraints).read_text().splitlines()]
    pins = [p for p in pins if re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", p)]
    procs = [subprocess.Popen([sys.executable, "-m", "pip", "install", "-qq", "--no-compile", "--no-deps", *share])
             for share in groups(pins, RUNS)]
    failed = [p.args for p in procs if p.wait()]
    if failed:
        print(f"preinstall: {len(failed)} of {len(procs)} pip runs failed (see above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
