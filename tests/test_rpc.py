"""helpers.rpc: method calls through RRefs and parameter RRefs, over real RPC between two workers; the transport
check of the RPC scripts' flags."""

import argparse
import sys
import warnings
from pathlib import Path

import pytest

from helpers.metrics import read_metrics
from helpers.rpc import FUNCTIONAL_OPTIMIZER_DEPRECATION, check_transport, hide_functional_optimizer_warning
from helpers.runner import run_script

SCRIPT = Path(__file__).parent / "scripts" / "rpc_methods.py"


def test_rpc_helpers_act_on_the_owners_objects(tmp_path):
    output = run_script(SCRIPT, "--out", tmp_path, echo=False, timeout=180).output
    (seen,) = read_metrics(tmp_path)
    assert FUNCTIONAL_OPTIMIZER_DEPRECATION in output, "DistributedOptimizer warns on the parameters' owner"
    assert seen["first"] == 2 and seen["second"] == 3, "remote_method and remote_method_async return results"
    assert seen["future_type"] == "Future"
    assert seen["ran_on"] == "worker1", "methods run on the RRef's owner"
    assert seen["items"] == ["a", "a", "b"], "calls changed the owner's object, kwargs included"
    assert seen["local_count"] == 2 and seen["remote_count"] == 2, "weight and bias of nn.Linear"
    assert seen["owners"] == ["worker1"], "remote parameter RRefs point to the module's owner"
    assert seen["changed"] == [True, True], "DistributedOptimizer stepped the remote parameters"


def test_hiding_the_deprecation_leaves_other_warnings_alone(monkeypatch):
    # In real runs, lesson 04's check cells assert the warning shown once per owner, then hidden by this filter.
    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *rest, **kw: shown.append(str(message)))
    hide_functional_optimizer_warning()
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # what PyTorch does around this warning
        warnings.warn(FUNCTIONAL_OPTIMIZER_DEPRECATION, DeprecationWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert shown == ["something else"]


IDLE = Path(__file__).parent / "scripts" / "rpc_idle.py"


def idle_cpu(tmp_path, transports):
    run_script(IDLE, "--out", tmp_path / transports, "--transports", transports, echo=False, timeout=120)
    return [record["cpu_seconds"] / record["seconds"] for record in read_metrics(tmp_path / transports)]


@pytest.mark.skipif(sys.platform != "linux", reason="TensorPipe's shm transport exists on Linux only")
def test_idle_rpc_workers_leave_the_cores_alone_and_shared_memory_would_not(tmp_path):
    """The reason ``Worker.rpc_options`` defaults to the uv transport: shm's reactor polls while it waits."""
    uv = idle_cpu(tmp_path, "default")
    shm = idle_cpu(tmp_path, "shm,uv")
    assert max(uv) < 0.1, f"idle workers on uv used {uv} of a core each"
    assert sum(shm) > 5 * sum(uv) + 0.3, f"shm {shm} vs uv {uv}: shared memory no longer polls; revisit the default"


def test_shared_memory_transport_is_refused_off_linux_in_one_line(monkeypatch, capsys):
    parser = argparse.ArgumentParser(prog="script.py")
    monkeypatch.setattr(sys, "platform", "linux")
    check_transport(parser, "shm")  # TensorPipe has it here
    monkeypatch.setattr(sys, "platform", "darwin")
    check_transport(parser, "uv")
    with pytest.raises(SystemExit) as refused:
        check_transport(parser, "shm")
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "script.py: error: --transport shm: TensorPipe has a shared-memory transport on Linux only, not on darwin; "
        "use --transport uv")
