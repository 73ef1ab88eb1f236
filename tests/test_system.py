"""helpers.system: the loopback interface from the OS's table, and one-line stops where the course cannot run."""

import socket
import sys
from collections import namedtuple
from pathlib import Path

import psutil
import pytest
import torch.distributed.rpc

import helpers
import helpers.launch
from helpers.runner import ScriptError, run_script, running_children
from helpers.system import Unsupported, check_platform, loopback_interface, require_rpc, socket_ifnames

# psutil.net_if_addrs() gives {interface: [snicaddr(family, address, netmask, broadcast, ptp)]}
Addr = namedtuple("Addr", "family address netmask broadcast ptp", defaults=(None, None, None))
LINUX = {"lo": [Addr(socket.AF_INET, "127.0.0.1", "255.0.0.0"), Addr(socket.AF_INET6, "::1"),
                Addr(psutil.AF_LINK, "00:00:00:00:00:00")],
         "eth0": [Addr(socket.AF_INET, "192.0.2.2", "255.255.255.0"), Addr(psutil.AF_LINK, "02:fc:00:00:00:01")]}
MACOS = {"en0": [Addr(psutil.AF_LINK, "a4:83:e7:00:00:01"), Addr(socket.AF_INET, "192.168.1.20", "255.255.255.0")],
         "lo0": [Addr(socket.AF_INET6, "::1"), Addr(socket.AF_INET6, "fe80::1%lo0"),
                 Addr(socket.AF_INET, "127.0.0.1", "255.0.0.0")],
         "gif0": [], "stf0": [], "utun0": [Addr(socket.AF_INET6, "fe80::e2e:2ea8:3b0c:7a1%utun0")]}
NO_LOOPBACK = {"eth0": LINUX["eth0"], "tun0": [Addr(socket.AF_INET, "10.8.0.2")]}


def test_the_interface_holding_127_0_0_1_is_lo_on_linux_and_lo0_on_macos():
    assert loopback_interface(LINUX) == "lo"
    assert loopback_interface(MACOS) == "lo0"


def test_this_machines_table_has_one():
    assert "127.0.0.1" in {a.address for a in psutil.net_if_addrs()[loopback_interface()]}


def test_a_machine_without_one_gets_a_one_line_error():
    with pytest.raises(RuntimeError) as refused:
        loopback_interface(NO_LOOPBACK)
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("no network interface holds 127.0.0.1 (interfaces: eth0, tun0)")
    assert "GLOO_SOCKET_IFNAME" in message and "TP_SOCKET_IFNAME" in message, "it says what to set"


def test_launch_sets_the_interfaces_the_user_left_unset(monkeypatch):
    for name in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    for table, name in ((MACOS, "lo0"), (LINUX, "lo")):
        assert socket_ifnames(table) == dict.fromkeys(("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"),
                                                      name)
    with pytest.raises(RuntimeError, match="no network interface holds 127.0.0.1"):
        socket_ifnames(NO_LOOPBACK)


def test_a_users_own_gloo_socket_ifname_is_kept(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    monkeypatch.delenv("TP_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=eth7")
    assert socket_ifnames(MACOS) == {"GLOO_SOCKET_IFNAME": "eth7", "TP_SOCKET_IFNAME": "lo0",
                                     "NCCL_SOCKET_IFNAME": "=eth7"}
    monkeypatch.setenv("TP_SOCKET_IFNAME", "eth7")
    assert socket_ifnames(NO_LOOPBACK) == {"GLOO_SOCKET_IFNAME": "eth7", "TP_SOCKET_IFNAME": "eth7",
                                           "NCCL_SOCKET_IFNAME": "=eth7"}, \
        "both chosen: no loopback is needed, so none missing is no error"


def _worker_never_runs(worker):
    raise AssertionError("must never run")


def test_no_loopback_is_refused_before_any_worker_starts(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: NO_LOOPBACK)
    with pytest.raises(RuntimeError, match="no network interface holds 127.0.0.1"):
        helpers.launch.launch(_worker_never_runs, 2)
    assert not running_children()


@pytest.fixture
def no_rpc(monkeypatch):
    """This PyTorch as a Windows build sees it: torch.distributed.rpc.is_available() is False."""
    monkeypatch.setattr(torch.distributed.rpc, "is_available", lambda: False)


@pytest.fixture
def in_a_notebook(monkeypatch):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: object())


def test_without_rpc_a_script_stops_in_one_line_that_says_wsl2(no_rpc):
    with pytest.raises(SystemExit) as stopped:
        require_rpc(platform="win32")
    assert stopped.value.code == ("this lesson needs torch.distributed.rpc, which PyTorch's Windows builds do "
                                  "not have: run the course in WSL2 (Windows Subsystem for Linux), as the "
                                  "README's 'Where it runs' says")
    with pytest.raises(SystemExit, match="this PyTorch was built without"):
        require_rpc(platform="linux")


def test_without_rpc_a_notebook_shows_one_line_and_no_traceback(no_rpc, in_a_notebook):
    with pytest.raises(Unsupported) as stopped:
        require_rpc(platform="win32")
    (line,) = stopped.value._render_traceback_()  # what IPython prints instead of a traceback
    assert line.startswith("Unsupported: this lesson needs torch.distributed.rpc") and line.endswith("says")


def test_with_rpc_nothing_stops():
    require_rpc()
    check_platform("linux")
    check_platform("darwin")


def test_an_rpc_script_run_without_rpc_ends_at_import_with_only_that_line(tmp_path):
    # the script imports helpers.rpc, as the RPC lessons' scripts do; rpc is made unavailable before it runs
    mock = ("import runpy, sys, torch.distributed.rpc as r; r.is_available = lambda: False; "
            "runpy.run_path(sys.argv[1], run_name='__main__')")
    script = Path(__file__).parent / "scripts" / "rpc_methods.py"
    with pytest.raises(ScriptError) as failed:
        run_script(script, "--out", tmp_path, command=[sys.executable, "-c", mock], echo=False, timeout=60)
    assert failed.value.output.strip().splitlines() == [
        "this lesson needs torch.distributed.rpc, which this PyTorch was built without: install the course's "
        "pinned versions (make install, or pip install -c constraints.txt -e .)"]
    assert not list(tmp_path.iterdir()), "no worker started"


def test_a_worker_asking_for_rpc_options_without_rpc_stops(no_rpc):
    worker = helpers.launch.Worker(0, 1, 0, "gloo", None, "file:///x/pg", "file:///x/rpc",
                                   helpers.launch.pick_backend("gloo", 1, "cpu"))
    with pytest.raises(SystemExit, match="needs torch.distributed.rpc"):
        worker.rpc_options()


def test_every_lesson_stops_on_native_windows_in_one_line(monkeypatch, in_a_notebook):
    with monkeypatch.context() as windows:
        windows.setattr(sys, "platform", "win32")
        with pytest.raises(Unsupported) as stopped:
            helpers.course_profile()  # the first helper each lesson's setup cell calls
    (line,) = stopped.value._render_traceback_()
    assert "native Windows" in line and "WSL2" in line
