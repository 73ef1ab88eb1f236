"""helpers.meters: laps, byte accounting, collective names and counts (counted in a real process group)."""

import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode

from helpers.meters import Laps, clock, collective_counts, local_bytes, peak_memory, plain_name


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


def test_local_bytes_counts_storage_and_skips_none():
    assert local_bytes([torch.zeros(10), None, torch.zeros(2, 3, dtype=torch.float64)]) == 10 * 4 + 6 * 8


def test_peak_memory_is_none_off_the_gpu():
    assert peak_memory(torch.device("cpu")) is None


def test_plain_names_of_collective_ops():
    assert plain_name("c10d_functional.all_gather_into_tensor") == "all-gather"
    assert plain_name("c10d_functional.reduce_scatter_tensor") == "reduce-scatter"
    assert plain_name("c10d.allreduce_") == "all-reduce"


def test_collective_counts_of_a_real_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with CommDebugMode() as comm:
            for _ in range(3):
                dist.all_reduce(torch.ones(4))
            dist.broadcast(torch.ones(2), src=0)
        assert collective_counts(comm) == {"all-reduce": 3, "broadcast": 1}
    finally:
        dist.destroy_process_group()
