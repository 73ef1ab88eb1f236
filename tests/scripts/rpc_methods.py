"""Test workload for helpers.rpc: worker0 drives an object and a module that live on worker1."""
import argparse

import torch
import torch.distributed.autograd as dist_autograd
from torch import nn
from torch.distributed import rpc
from torch.distributed.optim import DistributedOptimizer

from helpers.launch import launch
from helpers.metrics import MetricsWriter
from helpers.rpc import parameter_rrefs, remote_method, remote_method_async


class Store:
    def __init__(self):
        self.items = []

    def put(self, item, times=1):
        self.items.extend([item] * times)
        return len(self.items)

    def owner(self):
        return rpc.get_worker_info().name


def forward(module_rref, x):
    return module_rref.local_value()(x)


def run(worker, out):
    worker.init_rpc()  # as f"worker{rank}"
    if worker.rank == 0:
        store = rpc.remote("worker1", Store)
        first = remote_method(Store.put, store, "a", times=2)
        future = remote_method_async(Store.put, store, "b")
        second = future.wait()
        ran_on = remote_method(Store.owner, store)

        torch.manual_seed(0)
        local = nn.Linear(3, 2)
        remote_module = rpc.remote("worker1", nn.Linear, args=(3, 2))
        remote_params = parameter_rrefs(remote_module)
        before = [p.to_here().clone() for p in remote_params]
        optimizer = DistributedOptimizer(torch.optim.SGD, remote_params, lr=0.5)
        with dist_autograd.context() as context:
            loss = rpc.rpc_sync("worker1", forward, args=(remote_module, torch.ones(4, 3))).sum()
            dist_autograd.backward(context, [loss])
            optimizer.step(context)
        after = [p.to_here() for p in remote_params]
        MetricsWriter(out, 0).log(
            0, first=first, second=second, future_type=type(future).__name__, ran_on=ran_on,
            items=store.to_here().items, local_count=len(parameter_rrefs(local)),
            remote_count=len(remote_params), owners=sorted({p.owner().name for p in remote_params}),
            changed=[not torch.equal(b, a) for b, a in zip(before, after, strict=True)])
    rpc.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    launch(run, 2, args.out)


if __name__ == "__main__":
    main()
