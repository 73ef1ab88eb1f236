"""helpers.measure.comms: the collective log (c10d and DTensor's functional collectives), names of operators."""

import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers.measure.comms import CollectiveLog, kind, plain_name


@pytest.fixture
def one_rank_group(tmp_path):
    """A real gloo process group of one rank in this process (collectives run, with nobody else)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_plain_names_of_collective_ops():
    assert plain_name("c10d_functional.all_gather_into_tensor") == "all-gather"
    assert plain_name("c10d_functional.reduce_scatter_tensor") == "reduce-scatter"
    assert plain_name("c10d.allreduce_") == "all-reduce"
    assert plain_name("c10d.barrier") == "c10d.barrier" and kind("c10d.barrier") is None
    assert kind("_c10d_functional.all_to_all_single") == "all-to-all"
    assert kind("c10d._reduce_scatter_base_") == "reduce-scatter" and kind("c10d.scatter_") == "scatter"
    assert kind("c10d.send") == kind("c10d.recv_") == kind("c10d.recv_any_source_") == "send/recv"


def test_collective_log_records_kind_dtype_and_full_size_bytes(one_rank_group):
    with CollectiveLog() as comm:
        dist.all_reduce(torch.ones(100))
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the first: torch 2.14
        gather(torch.empty(16, dtype=torch.bfloat16), torch.ones(16, dtype=torch.bfloat16))
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


def test_collective_log_sees_dtensor_redistributions_as_pytorchs_comm_debug_mode_does():
    """DTensor issues functional collectives (tensor parallelism does): the log counts what CommDebugMode counts,
    with the payload on the full-size side. A fake process group of 4 ranks runs them in this process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        sharded = distribute_tensor(torch.zeros(8, 4), mesh, [Shard(0)])
        partial = DTensor.from_local(torch.zeros(8, 4), mesh, [Partial()])  # each rank holds a summand
        by_columns = distribute_tensor(torch.zeros(4, 4), mesh, [Shard(1)])
        with CommDebugMode() as theirs, CollectiveLog() as ours:
            sharded.full_tensor()  # all-gather
            partial.redistribute(mesh, [Replicate()])  # all-reduce
            partial.redistribute(mesh, [Shard(0)])  # reduce-scatter
            sharded @ by_columns  # an operator on DTensors: DTensor redistributes an operand first (all-gather)
        assert ours.counts() == {"all-gather": 2, "all-reduce": 1, "reduce-scatter": 1}
        assert {plain_name(op): k for op, k in theirs.get_comm_counts().items()} == ours.counts()
        assert [(c.kind, c.bytes) for c in ours.records][:3] == [
            ("all-gather", 8 * 4 * 4), ("all-reduce", 8 * 4 * 4), ("reduce-scatter", 8 * 4 * 4)]
    finally:
        dist.destroy_process_group()
