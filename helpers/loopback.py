"""Servers that listen on loopback only: a ``TCPStore``, and torchft's Lighthouse and Manager servers.

A ``TCPStore`` server binds to every interface whatever host name it is given, and torchft 0.2.0's ``Manager``
binds its server to ``[::]`` (every interface) in its constructor. Neither has authentication. Here each
listens on 127.0.0.1 instead:

    store = loopback_store()                        # a TCPStore server on 127.0.0.1, on a free port
    with torchft_on_loopback():                     # Manager(...) inside binds its server to 127.0.0.1
        manager = Manager(..., store_addr=LOOPBACK_HOST, store_port=store.port, hostname=LOOPBACK_HOST)
    lighthouse, address = loopback_lighthouse(min_replicas=2)
"""

from __future__ import annotations

import contextlib
import socket
from datetime import timedelta

LOOPBACK_HOST = "127.0.0.1"


def loopback_store(timeout: timedelta = timedelta(seconds=30)):
    """A ``torch.distributed.TCPStore`` server listening on 127.0.0.1 only, on a free port (``store.port``).

    The socket is bound here and handed to the store (``master_listen_fd``), so the store never binds itself.
    """
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK_HOST, 0))
    sock.listen()
    port = sock.getsockname()[1]
    # detach: the store owns the descriptor from here on (a garbage-collected socket object would close it)
    return dist.TCPStore(LOOPBACK_HOST, port, is_master=True, wait_for_workers=False, timeout=timeout,
                         master_listen_fd=sock.detach())


@contextlib.contextmanager
def torchft_on_loopback():
    """While inside, a torchft ``Manager`` built here binds its server to 127.0.0.1 instead of ``[::]``."""
    import torchft.manager

    original = torchft.manager.ManagerServer

    def loopback_server(*args, **kwargs):
        kwargs["bind"] = f"{LOOPBACK_HOST}:{kwargs['bind'].rsplit(':', 1)[1]}"  # keep the port it asked for
        return original(*args, **kwargs)

    torchft.manager.ManagerServer = loopback_server
    try:
        yield
    finally:
        torchft.manager.ManagerServer = original


def loopback_lighthouse(min_replicas: int, **options):
    """A torchft ``LighthouseServer`` on 127.0.0.1 and a free port; returns ``(server, "http://127.0.0.1:PORT")``.

    The server names itself by the machine's host name, which may resolve to another address; the address
    returned names loopback. ``options`` go to the server (``join_timeout_ms``, ``heartbeat_timeout_ms`` …).
    """
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind=f"{LOOPBACK_HOST}:0", min_replicas=min_replicas, **options)
    return server, f"http://{LOOPBACK_HOST}:{server.address().rsplit(':', 1)[1]}"
