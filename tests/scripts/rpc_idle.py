"""Test workload: how much CPU two RPC workers use while they wait, with a given TensorPipe transport."""
import argparse
import time

from torch.distributed import rpc

from helpers.launch import launch
from helpers.metrics import MetricsWriter


def run(worker, out, transports, seconds):
    options = {} if transports == "default" else {"_transports": transports.split(",")}
    worker.init_rpc(**options)
    rpc.rpc_sync(f"worker{(worker.rank + 1) % worker.world_size}", time.time)  # the transport is in use
    start = time.process_time()
    time.sleep(seconds)  # nothing to do: an idle worker
    MetricsWriter(out, worker.rank).log(0, cpu_seconds=time.process_time() - start, seconds=seconds)
    rpc.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--transports", default="default", choices=["default", "shm,uv", "uv"])
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    launch(run, 2, args.out, args.transports, args.seconds, backend="gloo", device="cpu")


if __name__ == "__main__":
    main()
