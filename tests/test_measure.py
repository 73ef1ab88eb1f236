"""helpers.measure: a timeline of forward and backward, CPU seconds and page faults, glibc's arenas."""

import os
import platform
import sys

import pytest
import torch
from torch import nn

from helpers import measure


@pytest.fixture
def not_linux(monkeypatch):
    """Pretend to be a Mac: what only Linux with glibc can measure must be skipped with one printed line."""
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    monkeypatch.setattr(measure, "_SAID", set())


def test_timeline_notes_each_micro_batch_forward_then_backward():
    timeline, net = measure.Timeline(), nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    inputs = [torch.randn(3, 4), torch.randn(3, 4)]
    outputs = [timeline.run(k, net, x) for k, x in enumerate(inputs)]
    assert all(torch.equal(out, net(x)) for out, x in zip(outputs, inputs, strict=True)), "run() is net(x)"
    assert [(k, phase) for k, phase, *_ in timeline.trace] == [(0, "forward"), (1, "forward")]
    torch.cat(outputs).sum().backward()
    trace = timeline.take()
    assert sorted((k, phase) for k, phase, *_ in trace) == [(0, "backward"), (0, "forward"), (1, "backward"),
                                                           (1, "forward")]
    assert all(start <= end for *_, start, end in trace) and timeline.take() == []
    forward_end = max(end for _, phase, _, end in trace if phase == "forward")
    assert all(start >= forward_end for _, phase, start, _ in trace if phase == "backward")


def test_usage_since_counts_this_process_cpu_seconds():
    before = measure.process_usage()
    x = torch.randn(256, 256)
    for _ in range(200):
        x = torch.tanh(x @ x)
    spent, now = measure.usage_since(before)
    assert spent["cpu_seconds"] > 0 and now["cpu_seconds"] >= before["cpu_seconds"] + spent["cpu_seconds"] - 1e-9
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert isinstance(spent["page_faults"], int) and spent["page_faults"] >= 0


def test_without_linux_and_glibc_page_faults_and_arenas_are_skipped_with_one_line(not_linux, monkeypatch, capsys):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert measure.page_faults() is None and measure.page_faults() is None
    assert measure.usage_since(measure.process_usage())[0]["page_faults"] is None
    measure.set_malloc_arenas(1)
    assert "MALLOC_ARENA_MAX" not in os.environ
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["page faults: skipped, it needs Linux with glibc (this is darwin, C library unknown)",
                     "MALLOC_ARENA_MAX=1: skipped, it needs Linux with glibc (this is darwin, C library unknown)"]


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"),
                    reason="glibc on Linux only")
def test_malloc_arenas_reach_the_environment_of_new_processes(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    measure.set_malloc_arenas(0)
    assert "MALLOC_ARENA_MAX" not in os.environ, "0 keeps the C library's default"
    measure.set_malloc_arenas(2)
    assert os.environ["MALLOC_ARENA_MAX"] == "2"
