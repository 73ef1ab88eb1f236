"""helpers.loopback: a TCPStore, torchft's Lighthouse and a torchft Manager that listen on 127.0.0.1 only."""

from datetime import timedelta

import torch.distributed as dist

from helpers.loopback import LOOPBACK_HOST, loopback_lighthouse, loopback_store, torchft_on_loopback
from helpers.measure.process import own_listeners


def test_store_lighthouse_and_manager_listen_on_loopback_only():
    import torch
    import torchft.manager
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    before = set(own_listeners() or [])
    store = loopback_store()
    client = dist.TCPStore(LOOPBACK_HOST, store.port, is_master=False, timeout=timedelta(seconds=10))
    client.set("key", "value")
    assert store.get("key") == b"value"
    lighthouse, address = loopback_lighthouse(min_replicas=1)
    try:
        assert address.startswith(f"http://{LOOPBACK_HOST}:")
        with torchft_on_loopback():
            pg = ProcessGroupGloo()  # healing over the process group: torchft's HTTP default listens everywhere
            manager = Manager(pg=pg, load_state_dict=None, state_dict=None, min_replica_size=1,
                              checkpoint_transport=PGTransport(pg, timedelta(seconds=10), torch.device("cpu")),
                              store_addr=LOOPBACK_HOST, store_port=store.port, rank=0, world_size=1,
                              lighthouse_addr=address, replica_id="r", hostname=LOOPBACK_HOST,
                              timeout=timedelta(seconds=10), connect_timeout=timedelta(seconds=10))
        assert torchft.manager.ManagerServer.__name__ == "ManagerServer", "the patch ends with the block"
        listeners = own_listeners()
        if listeners is not None:  # None where the system will not list sockets
            new = set(listeners) - before
            assert len(new) >= 3 and all(address == LOOPBACK_HOST for address, _ in new), new
        manager.shutdown(wait=False)
    finally:
        lighthouse.shutdown()
