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

from helpers.launch import launch, log
from helpers.metrics import MetricsWriter


def run(worker, args):
    dist.init_process_group(worker.backend, init_method=worker.init_method,
                            rank=worker.rank, world_size=worker.world_size)
    total = torch.tensor([float(worker.rank)])
    dist.all_reduce(total)
    listening = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
                        if c.status == psutil.CONN_LISTEN})
    seen = dict(rank=worker.rank, sum=total.item(), threads=torch.get_num_threads(), pid=os.getpid(),
                backend=worker.backend, device=str(worker.device), listening=listening)
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
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--threads", type=int, default=1, help="0 keeps PyTorch's default")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--exit-rank", type=int, default=-1)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.world_size < 1:
        parser.error(f"--world-size must be >= 1, got {args.world_size}")
    launch(run, args.world_size, args, backend=args.backend, threads=args.threads or None)


if __name__ == "__main__":
    main()
