"""The lessons' kernels under make test: forked from the lent warm starter (helpers.kernel), or started afresh."""

import os
import time

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

from helpers import kernel, warm

pytestmark = pytest.mark.skipif(not kernel.available() or not os.environ.get(warm.SHARED),
                                reason="no warm starter here (not Linux, a GPU present, or COURSE_WARM=0)")


def run(client, code, timeout=30):
    """Execute ``code`` in the kernel: (status, what it printed, the error's name)."""
    msg_id, out = client.execute(code), []
    deadline = time.monotonic() + timeout
    while True:
        msg = client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.1))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = client.get_shell_msg(timeout=timeout)
    return reply["content"]["status"], "".join(out), reply["content"].get("ename")


@pytest.mark.parametrize("warm_on", [True, False])
def test_a_kernel_forks_from_the_lent_starter_answers_an_interrupt_and_ends_whole(tmp_path, monkeypatch, warm_on):
    kernel.install_kernelspec(tmp_path)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    if not warm_on:
        monkeypatch.setenv("COURSE_WARM", "0")  # the starter cannot serve: Jupyter starts the kernel itself
    manager, client = start_new_kernel(kernel_name=kernel.KERNEL_NAME, cwd=str(tmp_path))
    pid = manager.provisioner.pid
    try:
        status, out, _ = run(client, "import os, sys\nprint(os.getppid(), 'torch' in sys.modules, os.getcwd())")
        ppid, preloaded, cwd = out.split()
        assert status == "ok" and cwd == str(tmp_path)
        assert (int(ppid) != os.getpid()) == warm_on and (preloaded == "True") == warm_on, \
            "a forked kernel is the starter's child and has torch imported before its first cell"
        # stop_on_error=False: the interrupted cell's error must not abort the cell sent after it
        start, sleep = time.monotonic(), client.execute("import time\ntime.sleep(60)", stop_on_error=False)
        time.sleep(1)
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=20)
        assert reply["parent_header"]["msg_id"] == sleep and reply["content"].get("ename") == "KeyboardInterrupt"
        assert time.monotonic() - start < 20, "the interrupt should end the sleep"
        assert run(client, "print('still here')")[:2] == ("ok", "still here\n")
    finally:
        manager.shutdown_kernel(now=True)
        client.stop_channels()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
