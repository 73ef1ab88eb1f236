"""helpers.measure.timing: phase laps, the micro-batch timeline, profiler rows (CPU, and kernels kept apart)."""

from types import SimpleNamespace

import torch
from torch import nn

from helpers.measure.timing import Laps, Timeline, clock, profiler_rows


def test_laps_add_up_each_phase_over_repeats():
    laps, cpu = Laps(torch.device("cpu")), torch.device("cpu")
    for _ in range(3):
        laps.start()
        end = clock(cpu) + 0.01
        while clock(cpu) < end:
            pass
        laps.lap("busy")
        laps.lap("nothing")
    means = laps.means(3)
    assert means["busy"] >= 0.01 and means["nothing"] < means["busy"]


def test_timeline_notes_each_micro_batch_forward_then_backward():
    timeline, net = Timeline(), nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
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


def test_profiler_rows_are_sorted_and_filtered():
    from torch.profiler import profile, record_function

    with profile() as prof:
        with record_function("first"):
            torch.ones(10).sum()
        with record_function("second"):
            torch.ones(10).sum()
    rows = profiler_rows(prof, lambda name: name in ("first", "second"))
    assert [r["name"] for r in rows] == ["first", "second"]
    assert rows[0]["start_ms"] == 0 and rows[1]["start_ms"] >= rows[0]["start_ms"] + rows[0]["ms"] * 0.99
    assert profiler_rows(prof, lambda name: False) == []



def test_profiler_rows_leave_out_device_side_events():
    """On a GPU a label appears twice (the CPU op and its device-side span) and kernels once, on the device:
    the rows are the CPU's view, each label once."""
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(name, device, start, end):
        span = SimpleNamespace(start=start, end=end)
        return SimpleNamespace(name=name, device_type=device, thread=1, time_range=span)

    prof = SimpleNamespace(events=lambda: [event("backward", cpu, 1000, 5000), event("backward", cuda, 2000, 9000),
                                           event("void gemm_kernel<float>", cuda, 2000, 6000)])
    assert profiler_rows(prof) == [{"name": "backward", "thread": 1, "start_ms": 0.0, "ms": 4.0}]
