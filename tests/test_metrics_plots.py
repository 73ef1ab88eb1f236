"""helpers.metrics and helpers.plots: what ranks write, the notebook reads and draws."""

from pathlib import Path

import pytest

from helpers.metrics import MetricsWriter, curves, read_metrics, run_dir
from helpers.plots import plot_bars, plot_curves
from helpers.runner import run_script

SCRIPT = Path(__file__).parent / "scripts" / "collective.py"


def test_ranks_write_and_the_notebook_reads_back(tmp_path):
    run_script(SCRIPT, "--world-size", 2, "--out", tmp_path, echo=False, timeout=120)
    records = read_metrics(tmp_path)
    assert [(r["rank"], r["step"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["sum"] == [1.0, 2.0][r["step"]] and r["time"] > 0 for r in records)
    assert curves(records, "sum") == {"rank 0": ([0, 1], [1.0, 2.0]), "rank 1": ([0, 1], [1.0, 2.0])}


def test_writer_appends_one_json_line_per_call(tmp_path):
    writer = MetricsWriter(tmp_path, rank=3)
    writer.log(0, loss=1.5)
    record = writer.log(1, loss=0.5, accuracy=0.9)
    assert record["rank"] == 3 and record["accuracy"] == 0.9
    assert len((tmp_path / "rank3.jsonl").read_text().splitlines()) == 2
    assert curves(read_metrics(tmp_path), "accuracy") == {"rank 3": ([1], [0.9])}


def test_reading_an_empty_folder_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics"):
        read_metrics(tmp_path)


def test_run_dir_starts_fresh_under_course_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RUNS", str(tmp_path))
    first = run_dir("00_x/run")
    (first / "old.jsonl").write_text("{}\n")
    assert run_dir("00_x/run") == tmp_path / "00_x" / "run"
    assert not (first / "old.jsonl").exists()
    assert (run_dir("00_x/run", fresh=False)).is_dir()


def test_plot_curves_saves_a_labelled_png(tmp_path):
    ax = plot_curves({"rank 0": ([0, 1, 2], [3, 2, 1]), "rank 1": ([0, 1, 2], [3, 1, 0.5])},
                     "Loss per rank", "step", "loss", path=tmp_path / "sub" / "loss.png", logy=True)
    assert (tmp_path / "sub" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("Loss per rank", "step", "loss")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["rank 0", "rank 1"]
    assert ax.get_yscale() == "log"


def test_plot_bars_writes_each_value_on_its_bar(tmp_path):
    ax = plot_bars({"1 worker": 120.0, "2 workers": 210.5}, "Throughput", "samples/s",
                   path=tmp_path / "bars.png", fmt="{:.0f}")
    assert (tmp_path / "bars.png").exists() and ax.get_legend() is None
    assert [t.get_text() for t in ax.texts] == ["120", "210"]
