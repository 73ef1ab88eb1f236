"""The course's few plots: curves per rank or setting, and bars of timings.

Every function draws on a new figure (or on ``ax``), titles and labels it, and
saves a PNG when given ``path``; it returns the matplotlib Axes.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt


def plot_curves(curves: dict, title: str, xlabel: str, ylabel: str, path=None, ax=None,
                logx: bool = False, logy: bool = False, marker: str | None = None):
    """One line per entry of ``curves`` (``{label: (xs, ys)}``), with a legend if there are several."""
    ax = ax or plt.figure(figsize=(6.4, 4)).gca()
    for label, (xs, ys) in curves.items():
        ax.plot(xs, ys, label=label, marker=marker)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    _finish(ax, title, xlabel, ylabel, legend=len(curves) > 1)
    return save(ax, path)


def plot_bars(values: dict, title: str, ylabel: str, path=None, ax=None, fmt: str = "{:.3g}"):
    """One bar per entry of ``values`` (``{label: number}``), each with its value written on top."""
    ax = ax or plt.figure(figsize=(6.4, 4)).gca()
    bars = ax.bar(list(map(str, values)), list(values.values()), color="tab:blue")
    ax.bar_label(bars, labels=[fmt.format(v) for v in values.values()])
    _finish(ax, title, None, ylabel, legend=False)
    return save(ax, path)


def _finish(ax, title, xlabel, ylabel, legend):
    ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend()


def save(ax, path=None):
    """Save ``ax``'s figure as a PNG at ``path`` (folders created) if given; return ``ax``."""
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        ax.figure.tight_layout()
        ax.figure.savefig(path, dpi=110)
    return ax
