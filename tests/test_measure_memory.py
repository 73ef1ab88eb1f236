"""helpers.measure.memory: bytes held (plain tensors, DTensor shards, optimizer state) and saved for backward."""

import torch
import torch.distributed as dist
from torch import nn

from helpers.measure.memory import (
    SavedActivations,
    SavedTensorBytes,
    local_bytes,
    optimizer_bytes,
    peak_memory,
    storage_bytes,
)


def test_local_bytes_counts_each_tensors_elements_and_skips_none():
    assert local_bytes([torch.zeros(10), None, torch.zeros(2, 3, dtype=torch.float64)]) == 10 * 4 + 6 * 8
    base = torch.zeros(100)
    assert local_bytes([base[:10], base[10:30]]) == 30 * 4  # views count what they show, not their storage


def test_storage_bytes_count_each_storage_once_and_whole():
    base = torch.zeros(100)
    other = torch.zeros(3, dtype=torch.float64)
    # two views of one storage count it once, by its whole size; a view shorter than its storage counts it all
    assert storage_bytes([base[:10], base[10:30], None, other]) == 100 * 4 + 3 * 8
    assert storage_bytes([base[90:]]) == 100 * 4
    assert storage_bytes([]) == 0


def test_peak_memory_is_none_off_the_gpu():
    assert peak_memory(torch.device("cpu")) is None


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
        assert storage_bytes([sharded]) == sharded.to_local().untyped_storage().nbytes()
    finally:
        dist.destroy_process_group()


def test_held_saved_counts_what_autograd_holds_until_each_backward_and_its_peak():
    from helpers.measure.memory import HeldSaved

    layer = nn.Linear(10, 10)
    current = [None]
    chunks = [torch.randn(4, 10) for _ in range(3)]
    with HeldSaved(exclude=layer.parameters(), label=lambda: current[0]) as held:
        losses = []
        for k, x in enumerate(chunks):  # GPipe's order: every forward, then every backward
            current[0] = k
            losses.append(torch.tanh(layer(x)).sum())  # saves x (for the weight) and tanh's output
        one = held.peak_bytes // 3
        assert held.bytes == held.peak_bytes == 3 * one and held.peak_labels == 3 and one == 2 * 4 * 40
        for k, loss in enumerate(losses):
            loss.backward()  # frees micro-batch k's graph, and with it what autograd held for it
            assert held.bytes == (2 - k) * one
    assert held.bytes == 0 and held.peak_labels == 3
    with HeldSaved(exclude=layer.parameters(), label=lambda: current[0]) as held:
        for k, x in enumerate(chunks):  # one forward, then its backward: one micro-batch held at a time
            current[0] = k
            torch.tanh(layer(x)).sum().backward()
    assert held.peak_labels == 1 and held.peak_bytes == one and held.bytes == 0


def test_held_saved_releases_a_label_whose_storage_another_label_still_holds():
    from helpers.measure.memory import HeldSaved

    w = torch.randn(10, 10, requires_grad=True)
    batch, current = torch.randn(6, 10), [None]
    with HeldSaved(label=lambda: current[0]) as held:  # three views of one batch: one storage, three labels
        losses = []
        for k, x in enumerate(batch.tensor_split(3)):
            current[0] = k
            losses.append((x @ w).sum())  # saves x (a view of the batch) for the gradient of w
        losses[0].backward()
        assert held.peak_labels == 3 and len(held._labels) == 2  # micro-batch 0 holds nothing now
        assert held.bytes == batch.nbytes  # the batch's whole storage stays held by the other two


def test_saved_activations_leave_out_the_weights_the_model_holds_when_each_tensor_is_saved():
    """Float32, a batch of 3: the input (3 x 4) and the ReLU's output (3 x 8, saved by ReLU and the second Linear,
    one storage) count, 48 + 96 bytes; the weights do not, even one the model takes up after the count began
    (as FSDP2 gathers a block's weights for its forward), which an exclusion list made up front would count."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    with SavedTensorBytes(exclude=list(model.parameters())) as up_front:
        model[2].weight = nn.Parameter(torch.randn(2, 8))  # a weight the model holds from now on
        model(x).sum().backward()
    with SavedActivations(model) as saved:
        model[2].weight = nn.Parameter(torch.randn(2, 8))
        model(x).sum().backward()
    assert saved.bytes == 48 + 96
    assert up_front.bytes == 48 + 96 + 2 * 8 * 4  # the new weight counted as an activation
