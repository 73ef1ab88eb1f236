"""Test workload: every rank all-reduces its rank and records what it saw; flags make it misbehave."""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from helpers.flags import add_device_flags, check_placement, integer
from helpers.launch import launch, log
from helpers.metrics import MetricsWriter
from helpers.system import SOCKET_IFNAMES


class Freed:
    """Writes its file when freed: whether a rank's objects were freed as its function returned."""

    def __init__(self, path):
        self.path = path

    def __del__(self):
        Path(self.path).write_text("freed")


def run(worker, args):
    kept = Freed(Path(args.out, f"freed{worker.rank}"))  # noqa: F841 (a local that launch must not free)
    worker.init_process_group()
    total = torch.tensor([float(worker.rank)], device=worker.device)
    dist.all_reduce(total)
    if args.threads != 1:  # an operation large enough to run on every thread the worker has (OpenMP's pool)
        torch.ones(1 << 21).exp().sum()
    torch.manual_seed(worker.rank)  # different weights per rank: DDP must replace them with rank 0's
    ddp = worker.ddp(torch.nn.Linear(2, 1).to(worker.device))
    ddp(torch.full((1, 2), float(worker.rank + 1), device=worker.device)).sum().backward()
    listening = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
                        if c.status == psutil.CONN_LISTEN})
    seen = dict(rank=worker.rank, sum=total.item(), threads=torch.get_num_threads(), pid=os.getpid(),
                backend=worker.backend, device=str(worker.device), listening=listening, placement=str(worker.placement),
                init_method=worker.init_method, ifnames={name: os.environ.get(name) for name in SOCKET_IFNAMES},
                start_method=worker.start_method,
                ddp_weight=ddp.module.weight.tolist(), ddp_grad=ddp.module.weight.grad.tolist())
    Path(args.out, f"rank{worker.rank}.json").write_text(json.dumps(seen))
    MetricsWriter(args.out, worker.rank).log(0, sum=total.item())
    MetricsWriter(args.out, worker.rank).log(1, sum=2 * total.item())
    log(worker.rank, f"sum {total.item():.0f}")
    if worker.rank == args.fail_rank:
        raise ZeroDivisionError(f"deliberate failure on rank {worker.rank}")
    if worker.rank == args.exit_rank:
        print(f"rank {worker.rank} exits with code 3, skipping Python's clean-up", file=sys.stderr, flush=True)
        os._exit(3)
    if args.hang:
        time.sleep(3600)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {worker.rank} finished", end="")  # left in stdout's buffer: the launcher must flush it


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world-size", type=integer(low=1), default=2)
    add_device_flags(parser)
    parser.add_argument("--threads", type=integer(low=0), default=1, help="0 keeps PyTorch's default")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--exit-rank", type=int, default=-1)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--compute-first", action="store_true",
                        help="compute on PyTorch's default threads in this process before starting the workers")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    placement = check_placement(parser, args, args.world_size)
    print(f"devices: {placement}", flush=True)
    if args.compute_first:
        torch.ones(1 << 21).exp().sum()
    launch(run, args.world_size, args, backend=args.backend, device=args.device, threads=args.threads or None)


if __name__ == "__main__":
    main()
