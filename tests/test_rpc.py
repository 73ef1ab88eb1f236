"""helpers.rpc: method calls through RRefs and parameter RRefs, over real RPC between two workers."""

from pathlib import Path

from helpers.launch import run_script
from helpers.metrics import read_metrics

SCRIPT = Path(__file__).parent / "scripts" / "rpc_methods.py"


def test_rpc_helpers_act_on_the_owners_objects(tmp_path):
    run_script(SCRIPT, "--out", tmp_path, echo=False, timeout=180)
    (seen,) = read_metrics(tmp_path)
    assert seen["first"] == 2 and seen["second"] == 3, "remote_method and remote_method_async return results"
    assert seen["future_type"] == "Future"
    assert seen["ran_on"] == "worker1", "methods run on the RRef's owner"
    assert seen["items"] == ["a", "a", "b"], "calls changed the owner's object, kwargs included"
    assert seen["local_count"] == 2 and seen["remote_count"] == 2, "weight and bias of nn.Linear"
    assert seen["owners"] == ["worker1"], "remote parameter RRefs point to the module's owner"
    assert seen["changed"] == [True, True], "DistributedOptimizer stepped the remote parameters"
