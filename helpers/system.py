"""What the course needs from the operating system, found out rather than assumed.

The course runs on Linux and macOS, and on Windows through WSL2 (a Linux). Three things differ there:

* the loopback interface is ``lo`` on Linux and ``lo0`` on macOS: :func:`loopback_interface` asks psutil's
  interface table which one holds 127.0.0.1, and :func:`socket_ifnames` names it in ``GLOO_SOCKET_IFNAME``,
  ``TP_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` for a run that stays on this machine (:func:`free_port`
  finds it a port);
* PyTorch's Windows builds have no ``torch.distributed.rpc`` (TensorPipe is not built for Windows), and
  the launcher needs POSIX process groups: :func:`check_platform` and :func:`require_rpc` stop there in
  one line that says to use WSL2;
* measurements that only Linux offers (``/proc``, glibc's allocator, other processes' sockets or stacks
  without root) are called through helpers that print one line saying what they skipped and why.
"""

from __future__ import annotations

import os
import socket
import sys

WSL2 = "run the course in WSL2 (Windows Subsystem for Linux), as the README's 'Where it runs' says"


class Unsupported(RuntimeError):
    """This system cannot run what was asked. In a notebook, IPython shows only this one line, no traceback."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook for exceptions that render themselves
        return [f"{type(self).__name__}: {self}"]


def stop(message: str):
    """End here with ``message`` as the only line: :class:`Unsupported` inside IPython (a notebook), where
    SystemExit would print a warning about exiting; ``SystemExit`` elsewhere, as in a script (exit code 1,
    the message alone on stderr)."""
    ipython = sys.modules.get("IPython")
    if ipython is not None and ipython.get_ipython() is not None:
        raise Unsupported(message)
    raise SystemExit(message)


LOOPBACK = ("127.0.0.1", "localhost", "::1")


# the variables that tell gloo, TensorPipe and NCCL (its bootstrap and proxy sockets) which network interface to use
SOCKET_IFNAMES = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def loopback_interface(table: dict | None = None) -> str:
    """The name of the network interface that holds 127.0.0.1: ``lo`` on Linux, ``lo0`` on macOS.

    ``table`` has the shape of ``psutil.net_if_addrs()`` (``{name: [addresses]}``, each with ``family``
    and ``address``), which it defaults to. Raises RuntimeError, in one line, when no interface holds it.
    """
    if table is None:
        import psutil

        table = psutil.net_if_addrs()
    for name, addresses in table.items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    raise RuntimeError(
        f"no network interface holds 127.0.0.1 (interfaces: {', '.join(table) or 'none'}): "
        "set GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to the interface the workers should "
        "talk over")


def check_platform(platform: str | None = None) -> None:
    """Stop (see :func:`stop`) on native Windows, where the course cannot run; return elsewhere.

    The launcher ends a run's workers through POSIX process groups, the lessons read the load average, and
    PyTorch's Windows builds have no ``torch.distributed.rpc``: WSL2 gives all three.
    """
    if (platform or sys.platform) == "win32":
        stop(f"this is native Windows, where PyTorch has no torch.distributed.rpc and the course's launcher "
             f"has no POSIX process groups: {WSL2}")


def rpc_available() -> bool:
    """True where this PyTorch has ``torch.distributed.rpc`` (Linux and macOS builds; not Windows builds)."""
    import torch.distributed

    if not torch.distributed.is_available():
        return False
    import torch.distributed.rpc

    return torch.distributed.rpc.is_available()


def require_rpc(platform: str | None = None) -> None:
    """Stop (see :func:`stop`) in one line where this PyTorch has no ``torch.distributed.rpc``."""
    if rpc_available():
        return
    if (platform or sys.platform) == "win32":
        stop(f"this lesson needs torch.distributed.rpc, which PyTorch's Windows builds do not have: {WSL2}")
    stop("this lesson needs torch.distributed.rpc, which this PyTorch was built without: "
         "install the course's pinned versions (make install, or pip install -c constraints.txt -e .)")


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def socket_ifnames(table: dict | None = None) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME``, ``TP_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` for a run that stays on this machine.

    A value the user set is kept; the others name the loopback interface, which the operating system's
    interface table gives (``lo`` on Linux, ``lo0`` on macOS: see :func:`helpers.system.loopback_interface`,
    which ``table`` is passed to). Raises RuntimeError in one line if one is needed and none holds 127.0.0.1.
    """
    missing = [name for name in SOCKET_IFNAMES if not os.environ.get(name)]
    loopback = loopback_interface(table) if missing else None
    return {name: os.environ.get(name) or loopback for name in SOCKET_IFNAMES}
