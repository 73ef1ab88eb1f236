"""helpers.measure.wire: the bytes a rank sends to other ranks and gloo's messages, on real ranks; alpha and beta."""

import json
import math
import textwrap

from helpers.runner import run_script

SCRIPT = textwrap.dedent('''
    import json
    import sys
    import torch
    import torch.distributed as dist
    from helpers.launch import launch
    from helpers.measure.wire import SentLog, ping_pong_alpha_beta

    def run(worker, _):
        worker.init_process_group()
        rank, world = worker.rank, worker.world_size
        with SentLog() as sent:
            dist.all_gather([torch.empty(10) for _ in range(world)], torch.ones(10))       # 40 B to each other rank
            dist.all_to_all_single(torch.empty(3 * world), torch.ones(3 * world))          # 12 B to each other rank
            send = [0] * world
            send[(rank + 1) % world] = 5
            receive = [0] * world
            receive[(rank - 1) % world] = 5
            dist.all_to_all_single(torch.empty(5), torch.ones(5), receive, send)          # one non-empty split
            dist.scatter(torch.empty(2), [torch.ones(2)] * world if rank == 0 else None, src=0)
            ops = [dist.P2POp(dist.isend, torch.ones(4), (rank + 1) % world),
                   dist.P2POp(dist.irecv, torch.empty(4), (rank - 1) % world)]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        alpha, beta = ping_pong_alpha_beta(rank, sizes=(1024, 1 << 20), trips=5)
        with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
            json.dump(dict(rank=rank, bytes=sent.bytes(), calls=sent.calls(), messages=sent.messages(),
                           alpha=alpha, beta=beta), f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        launch(run, 3, None, device="cpu")
''')


def test_sent_log_counts_bytes_to_other_ranks_and_gloos_messages(tmp_path):
    path = tmp_path / "wire_probe.py"
    path.write_text(SCRIPT)
    run_script(path, tmp_path, timeout=120, echo=False)
    results = {r["rank"]: r for r in (json.loads(f.read_text()) for f in tmp_path.glob("rank*.json"))}
    assert sorted(results) == [0, 1, 2]
    for rank, r in results.items():
        root = 2 * 4 * 2 if rank == 0 else 0  # the scatter's root sends its 2 other pieces of 8 B
        assert r["bytes"] == {"all-gather": 2 * 40, "all-to-all": 2 * 12 + 5 * 4, "scatter": root, "send/recv": 16}
        assert r["calls"] == {"all-gather": 1, "all-to-all": 2, "scatter": 1, "send/recv": 1}
        # gloo's alltoallv messages both peers even where a split is empty; the root scatters 2 messages
        assert r["messages"] == {"all-gather": 2, "all-to-all": 4, "scatter": 2 if rank == 0 else 0, "send/recv": 1}
        # every rank holds rank 0's fit (its sign is the machine's load's to decide, so it is not asserted)
        assert (r["alpha"], r["beta"]) == (results[0]["alpha"], results[0]["beta"]) and math.isfinite(r["beta"])
