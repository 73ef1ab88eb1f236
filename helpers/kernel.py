"""Jupyter kernels forked from the warm starter (:mod:`helpers.warm`) instead of started afresh.

A lesson's kernel imports torch, torch.distributed and the course's helpers in its first cell: seconds on a
small CPU, once per lesson in ``make test`` (measured: about 1.6 s of CPU and of wall time less per kernel on
2 cores; ``tests/conftest.py`` selects this kernel there). :class:`WarmProvisioner`, a jupyter_client
kernel provisioner, asks the starter that ``make test`` lends (``COURSE_WARM_SOCKET``) to fork the kernel
(``python -m ipykernel_launcher -f <connection file>``) from a process that has already imported them; where
the starter cannot serve it (no starter, another import-time environment, a GPU present) the kernel starts as
Jupyter would start it. The forked kernel leads its own process group, as Jupyter's kernels do, so interrupts,
``kill`` and ``terminate`` reach it by its group; its exit code comes back through the starter.

:func:`install_kernelspec` writes the kernel spec (``course-warm``) that names this provisioner.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from jupyter_client.provisioning import LocalProvisioner

from helpers import warm

KERNEL_NAME = "course-warm"
PROVISIONER = "course-warm-provisioner"  # the entry point in pyproject.toml


class _Kernel:
    """What LocalProvisioner uses of a Popen, for a kernel the warm starter forked."""

    def __init__(self, proc: warm.WarmProcess):
        self._proc, self.pid, self.stdin, self.stderr = proc, proc.pid, None, None
        self.stdout = proc.stdout  # what the kernel writes to its fds 1 and 2, copied to ours as Jupyter's would be
        threading.Thread(target=self._copy, daemon=True).start()

    def _copy(self) -> None:
        try:
            for line in self.stdout:
                sys.stderr.write(line)
        except (OSError, ValueError):  # closed by wait()
            pass

    def poll(self):
        return self._proc.poll()

    def wait(self, timeout=None):
        return self._proc.wait()

    def send_signal(self, signum: int) -> None:
        if self._proc.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class WarmProvisioner(LocalProvisioner):
    """LocalProvisioner whose kernel is forked from the lent warm starter where it can serve it."""

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        env, cwd = kwargs.get("env") or dict(os.environ), kwargs.get("cwd") or os.getcwd()
        proc = None
        if cmd[1:3] == ["-m", "ipykernel_launcher"] and env.get(warm.SHARED):
            proc = warm.start(cmd[1:], cwd, {**env, "JPY_PARENT_PID": str(os.getpid())})  # as Jupyter sets it
        if proc is None:
            return await super().launch_kernel(cmd, **kwargs)
        self.process, self.pid, self.pgid, self.cwd = _Kernel(proc), proc.pid, proc.pid, cwd
        return self.connection_info


def install_kernelspec(folder: Path) -> Path:
    """Write the ``course-warm`` kernel spec under ``folder/kernels`` (put ``folder`` on ``JUPYTER_PATH``)."""
    spec = Path(folder) / "kernels" / KERNEL_NAME
    shutil.rmtree(spec, ignore_errors=True)
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (course, warm)", "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": PROVISIONER}}}))
    return spec


def available() -> bool:
    """True where Jupyter can find this provisioner (the course installed with its entry points) and the warm
    starter can be used here."""
    from importlib.metadata import entry_points

    provisioners = entry_points(group="jupyter_client.kernel_provisioners")
    return warm.usable() and any(e.name == PROVISIONER for e in provisioners)
