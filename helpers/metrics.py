"""Per-rank JSON-lines metrics: workers append, the notebook reads back and plots.

Each record is one line: ``{"step": 3, "rank": 1, "time": <unix seconds>, "loss": 0.41, ...}``
in ``<run_dir>/rank<rank>.jsonl``; one file per rank, so ranks never share a file.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path


def run_dir(name: str, fresh: bool = True) -> Path:
    """The folder for one run's metrics and figures: ``$COURSE_RUNS/name`` (default ``runs/name``).

    ``fresh`` empties it first, so a re-run never mixes with the last one.
    """
    path = Path(os.environ.get("COURSE_RUNS", "runs")) / name
    if fresh and path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


class MetricsWriter:
    """Appends one JSON line per :meth:`log` call to ``<run_dir>/rank<rank>.jsonl``."""

    def __init__(self, run_dir, rank: int):
        self.rank = rank
        self.path = Path(run_dir) / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, step: int, **values) -> dict:
        """Write ``step``, ``rank``, ``time`` and ``values`` (JSON-serialisable); return the record."""
        record = {"step": step, "rank": self.rank, "time": time.time(), **values}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return record


def read_metrics(run_dir) -> list[dict]:
    """Every record of every rank in ``run_dir``, sorted by (rank, time).

    Raises FileNotFoundError if the folder holds no ``rank*.jsonl`` file.
    """
    files = sorted(Path(run_dir).glob("rank*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no metrics (rank*.jsonl) in {run_dir}: did the run write any?")
    records = [json.loads(line) for f in files for line in f.read_text().splitlines() if line]
    return sorted(records, key=lambda r: (r["rank"], r["time"]))


def curves(records: list[dict], y: str, x: str = "step", by: str = "rank") -> dict:
    """Group records into ``{f"{by} {value}": (xs, ys)}`` for :func:`helpers.plots.plot_curves`.

    Only records that have both ``x`` and ``y`` count; groups keep record order.
    """
    out: dict = {}
    for r in records:
        if x in r and y in r:
            xs, ys = out.setdefault(f"{by} {r.get(by)}", ([], []))
            xs.append(r[x])
            ys.append(r[y])
    return out
