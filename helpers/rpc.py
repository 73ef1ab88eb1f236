"""Call methods on objects that RRefs point to, wherever they live.

An RRef names an object owned by one worker. These functions run a method on
that object, on its owner, from any worker:

    remote_method(Agent.select_action, agent_rref, observer_id, state)   # waits
    remote_method_async(Agent.select_action, agent_rref, ...)            # a Future

Importing it is where an RPC lesson or script first needs ``torch.distributed.rpc``: where PyTorch has
none (its Windows builds), the import stops in one line that says to use WSL2 (see helpers.system).
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch import nn
from torch.distributed import rpc

from helpers.system import require_rpc

require_rpc()


def check_transport(parser, transport: str) -> None:
    """Refuse ``--transport shm`` off Linux in one line (``parser.error``): TensorPipe's shared-memory transport
    exists on Linux only."""
    if transport == "shm" and not sys.platform.startswith("linux"):
        parser.error(f"--transport shm: TensorPipe has a shared-memory transport on Linux only, not on "
                     f"{sys.platform}; use --transport uv")


def call_method(method, rref, *args, **kwargs):
    """Run ``method(obj, *args, **kwargs)`` on the object that ``rref`` owns here; return its result."""
    return method(rref.local_value(), *args, **kwargs)


def remote_method(method, rref, *args, **kwargs):
    """Run ``method`` on the object behind ``rref`` on its owner and wait for the result."""
    return rpc.rpc_sync(rref.owner(), call_method, args=(method, rref, *args), kwargs=kwargs)


def remote_method_async(method, rref, *args, **kwargs) -> torch.futures.Future:
    """Like :func:`remote_method` but return at once with a Future of the result."""
    return rpc.rpc_async(rref.owner(), call_method, args=(method, rref, *args), kwargs=kwargs)


def parameter_rrefs(module) -> list:
    """RRefs to every parameter of ``module``, for ``DistributedOptimizer``.

    ``module`` is an ``nn.Module`` here or an RRef to one anywhere; in the second
    case the RRefs are made on the module's owner, so they point to its parameters.
    Returns a list with one ``RRef[Parameter]`` per parameter, in ``parameters()`` order.
    """
    if isinstance(module, nn.Module):
        return [rpc.RRef(p) for p in module.parameters()]
    return remote_method(parameter_rrefs, module)


FUNCTIONAL_OPTIMIZER_DEPRECATION = (
    "`TorchScript` support for functional optimizers is deprecated and will be removed in a future "
    "PyTorch release. Consider using the `torch.compile` optimizer instead.")


def hide_functional_optimizer_warning() -> None:
    """Stop this process from printing :data:`FUNCTIONAL_OPTIMIZER_DEPRECATION`, and nothing else.

    ``DistributedOptimizer`` builds a TorchScript functional optimizer on every worker that owns
    parameters, and PyTorch warns each time that this support is deprecated. It raises the warning
    inside ``warnings.catch_warnings()`` with ``simplefilter("always")``, which overrides any
    ``warnings.filterwarnings`` rule, so this wraps ``warnings.showwarning`` and drops exactly that
    message. Call it in each worker (the owners print the warning) once a lesson has explained it.
    """
    shown = warnings.showwarning
    if getattr(shown, "hides", None) == FUNCTIONAL_OPTIMIZER_DEPRECATION:
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if str(message) != FUNCTIONAL_OPTIMIZER_DEPRECATION:
            shown(message, category, filename, lineno, file, line)

    show.hides = FUNCTIONAL_OPTIMIZER_DEPRECATION
    warnings.showwarning = show
