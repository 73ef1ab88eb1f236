"""helpers.anatomy: saved-tensor bytes, held bytes, the collective log and profiler rows, on real tensors and groups."""

import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers.anatomy import CollectiveLog, SavedTensorBytes, optimizer_bytes, timeline
from helpers.meters import local_bytes


@pytest.fixture
def one_rank_group(tmp_path):
    """A real gloo process group of one rank in this process (collectives run, with nobody else)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_saved_bytes_count_each_storage_once():
    x = torch.randn(1000, requires_grad=True)
    with SavedTensorBytes() as saved:
        y = x.exp()  # exp saves its output
        z = y * y  # mul saves both operands: the same storage as exp's output
        w = x.sin()  # sin saves its input
    (z.sum() + w.sum()).backward()  # the graph still works: the hooks gave every tensor back
    assert saved.bytes == 2 * 4000 and saved.tensors == 4
    assert torch.allclose(x.grad, 2 * x.exp() ** 2 + x.cos())


def test_saved_bytes_leave_out_excluded_weights():
    layer = nn.Linear(10, 20)
    x = torch.randn(5, 10, requires_grad=True)
    with SavedTensorBytes(exclude=layer.parameters()) as saved:
        layer(x)
    assert saved.bytes == x.nbytes  # the input, for the weight's gradient
    assert saved.skipped_bytes == layer.weight.nbytes  # the weight, for the input's gradient, held anyway


def test_held_and_optimizer_bytes_of_plain_tensors():
    layer = nn.Linear(10, 20)
    optimizer = torch.optim.Adam(layer.parameters())
    layer(torch.randn(3, 10)).sum().backward()
    optimizer.step()
    params = list(layer.parameters())
    assert local_bytes(params) == local_bytes(p.grad for p in params) == 4 * 220
    assert local_bytes([None, params[0]]) == 4 * 200
    assert optimizer_bytes(optimizer) == 2 * 4 * 220 + 2 * 4  # two moments and a float32 step per tensor


def test_local_bytes_count_a_dtensor_by_its_local_shard():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        sharded = distribute_tensor(torch.zeros(8, 4), init_device_mesh("cpu", (4,)), [Shard(0)])
        assert local_bytes([sharded]) == 2 * 4 * 4
    finally:
        dist.destroy_process_group()


def test_collective_log_records_kind_dtype_and_full_size_bytes(one_rank_group):
    with CollectiveLog() as comm:
        dist.all_reduce(torch.ones(100))
        dist.all_gather_single(torch.empty(16, dtype=torch.bfloat16), torch.ones(16, dtype=torch.bfloat16))
        dist.broadcast(torch.ones(3), src=0)
    assert [(c.kind, c.dtype, c.bytes) for c in comm.records] == [
        ("all-reduce", "float32", 400), ("all-gather", "bfloat16", 32), ("broadcast", "float32", 12)]
    assert comm.counts() == {"all-reduce": 1, "all-gather": 1, "broadcast": 1}
    dist.all_reduce(torch.ones(1))  # after the block: not logged
    assert len(comm.records) == 3


def test_collective_log_sees_all_reduces_started_on_another_thread_once(one_rank_group):
    original = dist.all_reduce
    with CollectiveLog() as comm:
        thread = threading.Thread(target=dist.all_reduce, args=(torch.ones(10),))
        thread.start()
        thread.join()
        dist.all_reduce(torch.ones(5))
    assert sorted(c.bytes for c in comm.records) == [20, 40]
    assert dist.all_reduce is original, "the context puts torch.distributed.all_reduce back"


def test_collective_log_counts_ddp_buckets_and_a_compression_hook(one_rank_group):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    for hook, element in ((None, 4), (default_hooks.fp16_compress_hook, 2)):
        model = DistributedDataParallel(nn.Linear(64, 64))
        if hook is not None:
            model.register_comm_hook(None, hook)
        with CollectiveLog() as comm:
            model(torch.randn(2, 64)).sum().backward()
        assert comm.counts() == {"all-reduce": 1}
        assert comm.bytes()["all-reduce"] == element * (64 * 64 + 64)


def test_timeline_rows_are_sorted_and_filtered():
    from torch.profiler import profile, record_function

    with profile() as prof:
        with record_function("first"):
            torch.ones(10).sum()
        with record_function("second"):
            torch.ones(10).sum()
    rows = timeline(prof, lambda name: name in ("first", "second"))
    assert [r["name"] for r in rows] == ["first", "second"]
    assert rows[0]["start_ms"] == 0 and rows[1]["start_ms"] >= rows[0]["start_ms"] + rows[0]["ms"] * 0.99
    assert timeline(prof, lambda name: False) == []
