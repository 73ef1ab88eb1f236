"""helpers.measure.timing: phase laps, the micro-batch timeline, profiler rows (CPU, and kernels kept apart), the
action log of a pipeline schedule, and the alpha-beta fit of message times."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from helpers.measure.timing import ActionLog, Laps, OpCount, Timeline, clock, fit_alpha_beta, profiler_rows


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




def test_profiler_rows_keep_kernels_apart_and_drop_device_copies_of_cpu_labels():
    """A GPU profile lists a label twice (the CPU op and its device-side span) and kernels once: the rows keep
    the label once, from the CPU, and the kernels only when asked, each row saying where it ran."""
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(name, device, start, end, thread=1):
        span = SimpleNamespace(start=start, end=end)
        return SimpleNamespace(name=name, device_type=device, thread=thread, time_range=span)

    prof = SimpleNamespace(events=lambda: [
        event("backward", cpu, 0, 5000), event("backward", cuda, 1000, 9000, thread=7),
        event("gloo:all_reduce", cpu, 4000, 8000, thread=2), event("gloo:all_reduce", cuda, 4000, 8000, thread=7),
        event("cudaLaunchKernel", cpu, 100, 200), event("void gemm_kernel<float>", cuda, 2000, 6000, thread=7)])
    keep = lambda name: name in ("backward", "gloo:all_reduce")  # noqa: E731
    rows = profiler_rows(prof, keep, kernels=True)
    assert [(r["name"], r["device"]) for r in rows] == [
        ("backward", "cpu"), ("void gemm_kernel<float>", "cuda"), ("gloo:all_reduce", "cpu")]
    assert rows[1]["start_ms"] == 2.0 and rows[1]["ms"] == 4.0 and rows[1]["thread"] == 7
    assert [(r["name"], r["device"]) for r in profiler_rows(prof, keep)] == [
        ("backward", "cpu"), ("gloo:all_reduce", "cpu")], "without kernels=True: the CPU's rows only"


def test_action_log_notes_every_f_i_and_w_of_a_zero_bubble_schedule_and_changes_no_gradient(tmp_path):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.FileStore(str(tmp_path / "store"), 1))
    try:
        torch.manual_seed(0)
        blocks = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)).double()
        x, y = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
        F.mse_loss(blocks(x), y).backward()
        expected = [p.grad.clone() for p in blocks.parameters()]
        blocks.zero_grad(set_to_none=True)
        # one rank holding both stages of a V: stage 0 and stage 1 (the last), two micro-batches
        cpu = torch.device("cpu")
        stages = [PipelineStage(blocks[:2], 0, 2, cpu), PipelineStage(blocks[2:], 1, 2, cpu)]
        if not hasattr(ScheduleZBVZeroBubble, "_initialize_pp_stages"):  # before torch 2.14: a first handshake to
            for stage in stages:                                         # this rank itself, which gloo refuses
                stage._get_init_p2p_neighbors_ops = list
        schedule = ScheduleZBVZeroBubble(stages, n_microbatches=2, loss_fn=F.mse_loss)
        log = ActionLog(stages)
        schedule.step(x, target=y)
        rows = log.take()
    finally:
        dist.destroy_process_group()
    compute = sorted((s, a, k) for s, a, k, *_ in rows if a != "wait")
    assert compute == sorted((s, a, k) for s in (0, 1) for a in "FIW" for k in (0, 1)), rows
    assert all(start <= end for *_, start, end in rows) and log.take() == []
    assert all(torch.allclose(p.grad, e) for p, e in zip(blocks.parameters(), expected, strict=True))


SIZES = [4 * 4**k for k in range(12)]  # 4 B to 16 MiB, as lesson 01's ping-pong
ALPHA, BETA = 30e-6, 0.4e-9  # 30 us per message, 2.5 GB/s


def message_time(n):
    return ALPHA + n * BETA


def test_fit_alpha_beta_recovers_exact_points_from_lists_arrays_and_tensors():
    import numpy as np

    times = [message_time(n) for n in SIZES]
    for sizes, seconds in ((SIZES, times), (np.array(SIZES), np.array(times)),
                           (torch.tensor(SIZES), torch.tensor(times))):
        alpha, beta = fit_alpha_beta(sizes, seconds)
        assert type(alpha) is float and type(beta) is float
        assert alpha == pytest.approx(ALPHA, rel=1e-9) and beta == pytest.approx(BETA, rel=1e-9)


def test_fit_alpha_beta_keeps_the_fastest_time_of_each_size():
    """Every size three times, two of them slowed down (another program took the core): only the fastest counts."""
    sizes = SIZES * 3
    seconds = [message_time(n) * slower + wait for slower, wait in ((1.5, 1e-3), (1, 0), (2, 3e-4)) for n in SIZES]
    assert fit_alpha_beta(sizes, seconds) == pytest.approx((ALPHA, BETA), rel=1e-9)


def test_fit_alpha_beta_is_close_on_noisy_points():
    generator = torch.Generator().manual_seed(0)
    noise = 1 + 0.1 * torch.rand(len(SIZES), generator=generator, dtype=torch.float64)  # up to 10 % slower
    alpha, beta = fit_alpha_beta(SIZES, [message_time(n) * e for n, e in zip(SIZES, noise.tolist(), strict=True)])
    assert alpha == pytest.approx(ALPHA, rel=0.15) and beta == pytest.approx(BETA, rel=0.15)


def test_fit_alpha_beta_weighs_each_size_the_same():
    """The largest message 20 % slow: 1.3 ms of error, 40 times alpha. Relative least squares leaves alpha
    near its value; plain least squares of t (which this test can tell apart) would lose it."""
    seconds = [message_time(n) * (1.2 if n == SIZES[-1] else 1) for n in SIZES]
    alpha, beta = fit_alpha_beta(SIZES, seconds)
    assert alpha == pytest.approx(ALPHA, rel=0.05), "a large size's error swamped the small sizes"
    plain = torch.linalg.lstsq(torch.tensor([[1.0, n] for n in SIZES], dtype=torch.float64),
                               torch.tensor(seconds, dtype=torch.float64)[:, None]).solution.flatten().tolist()
    assert abs(plain[0] / ALPHA - 1) > 1, f"plain least squares should have lost alpha here, got {plain[0]}"


@pytest.mark.parametrize("sizes, seconds, message", [
    ([4, 16], [1e-5], "2 sizes but 1 times"),
    ([4, 4, 4], [1e-5, 2e-5, 3e-5], "at least two message sizes"),
    ([4, 16], [1e-5, 0.0], "times must be positive"),
], ids=["lengths-differ", "one-size", "zero-time"])
def test_fit_alpha_beta_refuses_what_it_cannot_fit(sizes, seconds, message):
    with pytest.raises(ValueError, match=message):
        fit_alpha_beta(sizes, seconds)


def test_op_count_counts_each_operation_once_and_changes_nothing():
    """Three operations forward; a backward adds its own; the result is the one computed without the count."""
    a, b = torch.arange(4.0, requires_grad=True), torch.full((4,), 2.0)
    with OpCount() as ops:
        out = (a * b + 1).sum()
    assert ops.count == 3 and out.item() == (torch.arange(4.0) * 2 + 1).sum().item()
    with OpCount() as more:
        out.backward()
    assert more.count > 0 and torch.equal(a.grad, b)
    with OpCount() as none:
        pass
    assert none.count == 0
