"""Start distributed workers: on this machine, or as one rank of a torchrun run.

Two ways in, one script:

* ``python script.py --world-size N`` calls :func:`launch`, which starts N
  worker processes on this machine (forked or spawned: :func:`choose_start_method`), each running
  ``fn(worker, *args)``.
* ``torchrun --nproc-per-node N script.py`` starts the processes itself;
  :func:`launch` sees ``RANK``/``WORLD_SIZE`` and runs ``fn`` once, as that rank.

A notebook never spawns workers itself: it writes a script with ``%%writefile`` and starts it with
:func:`helpers.runner.run_script`. An exercise run (:func:`helpers.exercises.format.exercise_of_run`) gives
its process groups a short timeout, and a failure's verdict comes from :mod:`helpers.diagnose`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from helpers import warm
from helpers.diagnose import failure_line, watch_ranks
from helpers.exercises.format import EXERCISE_ENV, exercise_of_run, exercise_timeout
from helpers.system import LOOPBACK, free_port, require_rpc, socket_ifnames

# An exercise run on NCCL: by default NCCL's watchdog ends a process whose collective timed out (SIGABRT, no
# Python traceback, so no "where each rank waited"). Blocking wait makes the timeout an exception raised in the
# rank's own thread instead, and CleanUpOnly (2) aborts the communicators without tearing the process down.
# A value the user set is kept.
NCCL_EXERCISE_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


class WorkerError(RuntimeError):
    """A worker raised or died; the message starts with its rank."""


BACKENDS = ("auto", "gloo", "nccl")


# what this process's environment said, as it started, about the variables a process reads at start
_STARTED_WITH = warm.environment_read(os.environ, warm.PROCESS_START)


DEVICES = ("auto", "cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the ranks of one machine compute and how they talk: what :func:`pick_backend` decided.

    ``str(placement)`` is the one line a lesson prints to say which path it took.
    """

    backend: str      # "nccl" or "gloo"
    device_type: str  # "cuda" or "cpu"
    gpus: int         # GPUs visible on this machine
    ranks: int        # ranks started on this machine
    asked: str = "auto"  # the device that was asked for
    mps: bool = False    # an Apple GPU (MPS) is present: never used for collectives, which gloo runs on the CPU

    def device(self, local_rank: int) -> torch.device:
        """The device of the rank with this local rank: ``cuda:(local_rank % gpus)``, or the CPU."""
        return torch.device("cuda", local_rank % self.gpus) if self.device_type == "cuda" else torch.device("cpu")

    def __str__(self) -> str:
        if self.backend == "nccl":
            return f"NCCL, one GPU per rank ({self.ranks} ranks, {self.gpus} GPUs): local rank r on cuda:r"
        if self.device_type == "cuda":
            return (f"gloo, {self.ranks} ranks share {self.gpus} GPU{'s' if self.gpus > 1 else ''}: "
                    f"local rank r on cuda:(r mod {self.gpus}) (NCCL needs one GPU per rank)")
        gpus = f"{self.gpus} GPU{'s' if self.gpus > 1 else ''}"
        if self.gpus == 0:
            why = "no GPU here"
        elif self.asked == "cpu":
            why = f"the CPU was asked for, {gpus} unused"
        else:  # pick_backend's only other way to the CPU with GPUs present: share_gpus=False, fewer GPUs than ranks
            why = f"{self.ranks} ranks, {gpus}: this script's ranks do not share a GPU, so they compute on the CPU"
        if self.gpus == 0 and self.mps:
            why = "no CUDA GPU here; this Mac's MPS GPU stays unused: gloo's collectives carry CPU tensors only"
        return f"gloo on the CPU ({why})"


def pick_backend(backend: str = "auto", ranks_per_machine: int = 1, device: str = "auto",
                 share_gpus: bool = True, gpus: int | None = None, mps: bool | None = None) -> Placement:
    """Decide backend and devices for ``ranks_per_machine`` ranks from what this machine has.

    * a GPU per rank: NCCL, local rank r on ``cuda:r``;
    * fewer GPUs than ranks: gloo with the ranks sharing the GPUs (gloo carries CUDA tensors for all-reduce,
      broadcast, reduce, all-gather, gather, scatter and all-to-all, staged through host memory, and builds
      reduce-scatter from all-reduce; not point-to-point send/recv), or the CPU if ``share_gpus`` is False
      (for code that gains nothing from ranks sharing one GPU, such as sharding, or that needs send/recv of
      CUDA tensors);
    * no GPU, or ``device="cpu"``: gloo on the CPU. An Apple GPU (``mps``) is never chosen: gloo has
      no MPS collectives, so a Mac computes and communicates on the CPU, and the placement says so.

    ``gpus`` overrides the visible GPU count, ``mps`` whether an Apple GPU is present (for tests).
    Raises ValueError, in one line saying what to change, for an unknown backend or device, NCCL
    without a GPU per rank, or CUDA without a GPU.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cuda" and gpus == 0:
        raise ValueError("device 'cuda' asked for, but no GPU is visible here: use --device auto or cpu")
    nccl_ok = dist.is_nccl_available() and gpus >= ranks_per_machine and device != "cpu"
    if backend == "nccl" and not nccl_ok:
        raise ValueError(
            f"backend 'nccl' needs one GPU per rank: {ranks_per_machine} ranks, "
            f"{0 if device == 'cpu' else gpus} GPUs to use here; use --backend gloo or auto")
    if backend == "auto":
        backend = "nccl" if nccl_ok else "gloo"
    on_gpu = device != "cpu" and gpus > 0 and (backend == "nccl" or share_gpus or gpus >= ranks_per_machine)
    if mps is None:
        mps = torch.backends.mps.is_available()
    return Placement(backend, "cuda" if on_gpu else "cpu", gpus, ranks_per_machine, device, mps)


def ranks_per_machine(world_size: int) -> int:
    """Ranks on this machine: torchrun's ``LOCAL_WORLD_SIZE`` if set, else the whole ``world_size``."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


@dataclasses.dataclass(frozen=True)
class Worker:
    """What one worker process knows about its place in the run.

    ``init_method`` is for ``dist.init_process_group``; ``rpc_init_method`` is a
    separate rendezvous for ``rpc.init_rpc`` so that a script may use both.
    ``device`` is where this rank computes; a rank that only serves RPCs never
    needs to touch it (nothing here creates a CUDA context). ``start_method`` says how this process started:
    ``"fork"`` or ``"spawn"`` (by :func:`launch`), or ``"torchrun"``.
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    init_method: str
    rpc_init_method: str
    placement: Placement
    start_method: str = "torchrun"

    def rpc_options(self, **kwargs) -> "torch.distributed.rpc.TensorPipeRpcBackendOptions":
        """TensorPipe options that rendezvous at ``rpc_init_method``; kwargs go to the options.

        The transport defaults to ``uv`` (TCP, on loopback for a local run): TensorPipe would otherwise pick
        its shared-memory transport, whose reactor polls while it waits and keeps about a core busy in every
        idle process; with more RPC processes than cores that takes the cores from the ranks that compute.
        Pass ``_transports=["shm", "uv"]`` to get TensorPipe's own choice back (lesson 05 measures both); shm
        exists on Linux only, and where it does not (macOS) TensorPipe skips it and uses uv.
        Stops in one line where PyTorch has no ``torch.distributed.rpc`` (:func:`helpers.system.require_rpc`).
        """
        require_rpc()
        from torch.distributed import rpc

        kwargs.setdefault("_transports", ["uv"])
        short = exercise_timeout()  # an exercise run: a stalled RPC ends in seconds, with a verdict
        if short is not None:
            kwargs.setdefault("rpc_timeout", short.total_seconds())
        return rpc.TensorPipeRpcBackendOptions(init_method=self.rpc_init_method, **kwargs)

    def init_process_group(self, **kwargs) -> None:
        """``dist.init_process_group`` with this worker's backend, rendezvous, rank and world size.

        On a GPU the rank's device becomes the current one first (NCCL also gets it as ``device_id``).
        Keyword arguments override, e.g. ``timeout=timedelta(seconds=30)``.
        """
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            if self.backend == "nccl":
                kwargs.setdefault("device_id", self.device)
        short = exercise_timeout()  # an exercise run: a deadlock ends in seconds with a verdict, not 30 minutes
        if short is not None:
            kwargs.setdefault("timeout", short)
            if self.backend == "nccl":  # a timed-out collective raises in Python, as on gloo, with a traceback
                for name, value in NCCL_EXERCISE_ENV.items():
                    os.environ.setdefault(name, value)
        dist.init_process_group(**{"backend": self.backend, "init_method": self.init_method,
                                   "rank": self.rank, "world_size": self.world_size, **kwargs})

    def init_rpc(self, name: str | None = None, **options) -> None:
        """``rpc.init_rpc`` as ``name`` (default ``worker<rank>``); ``options`` go to TensorPipe's options."""
        from torch.distributed import rpc

        rpc.init_rpc(name or f"worker{self.rank}", rank=self.rank, world_size=self.world_size,
                     rpc_backend_options=self.rpc_options(**options))

    def ddp(self, module: torch.nn.Module, **kwargs) -> torch.nn.parallel.DistributedDataParallel:
        """Wrap ``module`` (already on ``device``) in DDP: ``device_ids=[i]`` on GPU i, ``None`` on the CPU."""
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids, **kwargs)


def log(rank: int, *parts) -> None:
    """Print ``[rank N] parts...`` as one write, so lines of concurrent ranks never interleave."""
    sys.stdout.write(f"[rank {rank}] " + " ".join(map(str, parts)) + "\n")
    sys.stdout.flush()


def under_torchrun() -> bool:
    """True when this process was started by torchrun (or another launcher that sets RANK)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch(fn, world_size: int, *args, backend: str = "auto", device: str = "auto", share_gpus: bool = True,
           threads: int | None = 1, start_method: str | None = None) -> None:
    """Run ``fn(worker, *args)`` on ``world_size`` ranks and return when all have finished.

    Started by torchrun, this process is one rank: ``fn`` runs here once, then the process exits (code 0).
    Otherwise ``world_size`` processes are started on this machine, meeting through files in a fresh temporary
    folder (no TCP store, so nothing listens on a non-loopback address; GLOO/TP/NCCL_SOCKET_IFNAME name the
    loopback interface, see :func:`socket_ifnames`, unless the user set them or set ``MASTER_ADDR`` to another
    address). ``threads`` limits each worker's intra-op threads (``None`` keeps PyTorch's default). ``backend``,
    ``device`` and ``share_gpus`` go to :func:`pick_backend`; each worker gets the resulting :class:`Placement`
    and its own device in its :class:`Worker`. ``start_method`` is ``"fork"`` or ``"spawn"``; None (the
    default) lets :func:`choose_start_method` choose (fork where it is safe and cheaper).

    Bad arguments raise ValueError before anything is spawned; a worker that raises ends the run at once with
    :class:`WorkerError` carrying its traceback (the first worker's to raise, where several did).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be an integer >= 1, got {world_size!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None or an integer >= 1, got {threads!r}")
    if under_torchrun():
        _run_as_torchrun_rank(fn, world_size, args, pick_backend(backend, ranks_per_machine(world_size),
                                                                 device, share_gpus), threads)
        return
    if start_method not in (None, "fork", "spawn"):
        raise ValueError(f"start_method must be None, 'fork' or 'spawn', got {start_method!r}")
    _check_spawnable(fn)
    placement = pick_backend(backend, world_size, device, share_gpus)
    method = start_method or choose_start_method(placement, threads)
    if method == "fork" and not _fork_safe(placement, threads):
        raise ValueError("start_method 'fork' is for a CPU run started from a process with one Python thread "
                         "(and one thread of any kind where the workers run several): use 'spawn' or None")
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    ifnames = socket_ifnames() if addr in LOOPBACK else {}

    folder = tempfile.mkdtemp(prefix="course-rendezvous-")
    # run_script ends a run that overstays with SIGTERM, which by default ends Python without running the
    # finally below: turn it into SystemExit here, so the rendezvous folder goes with the run.
    restore = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        restore = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if addr in LOOPBACK:
        init, rpc_init = f"file://{folder}/pg", f"file://{folder}/rpc"
    else:  # the user chose an address: meet there over TCP
        init, rpc_init = f"tcp://{addr}:{free_port('')}", f"tcp://{addr}:{free_port('')}"
    plan = dict(world_size=world_size, placement=placement, init_method=init, rpc_init_method=rpc_init, addr=addr,
                ifnames=ifnames)
    exercise, report = exercise_of_run(), {}  # a script holding an exercise: each failure, one line
    if exercise:
        plan["ifnames"] = {**ifnames, EXERCISE_ENV: exercise}  # set in each worker's environment
    import torch.multiprocessing as mp

    try:
        with warnings.catch_warnings():  # Python 3.12+ on fork: the one other thread is OpenBLAS's (fork-safe)
            warnings.filterwarnings("ignore", message=r"This process \(pid=\d+\) is multi-threaded, use of fork",
                                    category=DeprecationWarning)
            context = mp.start_processes(_spawned, args=(fn, args, plan, threads, method), nprocs=world_size,
                                         start_method=method, join=False)
        raised = {}  # rank -> (when, traceback) of each worker that raised: PyTorch reports the first it finds
        try:
            report = watch_ranks(context) if exercise else {}  # read before a failure ends the others
            while not context.join():
                pass
        finally:  # a worker that raised left its traceback in a temporary file, which PyTorch keeps
            for rank, path in enumerate(context.error_files):
                with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
                    raised[rank] = (os.path.getmtime(path), pickle.loads(Path(path).read_bytes()))
                    os.remove(path)
    except mp.ProcessRaisedException as e:  # the first to raise, not a peer that failed because it did
        rank, error = min(((r, t.strip()) for r, (_, t) in raised.items()), key=lambda r: raised[r[0]][0],
                          default=(e.error_index, e.msg.split(":", 1)[1].strip()))
        raise WorkerError(f"rank {rank} raised:\n{error}{_verdict_line(exercise, report)}") from None
    except mp.ProcessExitedException as e:
        raise WorkerError(f"rank {e.error_index} died with exit code {e.exit_code}{_verdict_line(exercise, report)}") \
            from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)


def _verdict_line(exercise, report) -> str:
    """After a worker's failure in an exercise run, the exercise's one-line verdict on a line of its own; else ""."""
    return f"\n{failure_line(exercise, report, _script_folder())}" if exercise and report else ""


def _script_folder() -> Path | None:
    """The folder of the running script (where an exercise's files are), or None."""
    return Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] and Path(sys.argv[0]).is_file() else None


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _check_spawnable(fn) -> None:
    """Refuse, in one line, a function that spawned processes could not import."""
    module = sys.modules.get(getattr(fn, "__module__", None))
    if "<locals>" in getattr(fn, "__qualname__", "<locals>") or module is None:
        raise ValueError(f"{fn!r} must be a function defined at the top level of a module")
    if fn.__module__ == "__main__" and not getattr(module, "__file__", None):
        raise ValueError(
            f"{fn.__name__} is defined in a notebook or REPL, which spawned workers cannot import: "
            "write it to a script with %%writefile and start that with run_script"
        )


def choose_start_method(placement: Placement, threads: int | None = 1) -> str:
    """How :func:`launch` starts workers: ``"fork"`` where that is the same as a fresh process and cheaper (the
    workers inherit this process's imported torch): on Linux, no GPU present, workers :func:`_fork_safe` allows,
    and the environment a process reads as it starts unchanged since this one started (``MALLOC_ARENA_MAX`` set
    for the workers reaches a spawned worker, not a forked one). Elsewhere ``"spawn"``: a fresh interpreter."""
    if _fork_safe(placement, threads) and placement.gpus == 0 and warm.usable() and not torch.cuda.is_initialized() \
            and warm.environment_read(os.environ, warm.PROCESS_START) == _STARTED_WITH:
        return "fork"
    return "spawn"


def _fork_safe(placement: Placement, threads: int | None) -> bool:
    """What even a forced fork needs: CPU workers, from a process with one Python thread; workers of several
    threads each only from one with one OS thread. GNU OpenMP's pool (PyTorch's CPU kernels) keeps its threads
    after a first parallel operation; a forked child has the pool, not its threads, and waits for them forever."""
    tasks = "/proc/self/task"  # Linux: one entry per OS thread of this process
    return placement.device_type == "cpu" and threading.active_count() == 1 and (
        threads == 1 or (os.path.isdir(tasks) and len(os.listdir(tasks)) == 1))


def _prepare_process(threads: int | None) -> None:
    """What every worker process does first, however it was started."""
    # rpc.init_rpc trips this deprecation inside PyTorch itself; it says nothing about the learner's code.
    warnings.filterwarnings("ignore", message="You are using a Backend .* as a ProcessGroup")
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # for processes this worker starts
        torch.set_num_threads(threads)


def _spawned(rank, fn, args, plan, threads, method="spawn") -> None:
    """Entry point of each worker that launch started (forked or spawned): set up its environment, then call
    ``fn``."""
    if method == "fork":  # start as a spawned worker would: default SIGTERM, fresh random states
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        warm.fresh_seeds()
    _prepare_process(threads)
    os.environ.update(plan["ifnames"])  # gloo, TensorPipe, NCCL on loopback for a local run (the user's choice kept)
    os.environ.update(MASTER_ADDR=plan["addr"], RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(plan["world_size"]))
    placement = plan["placement"]  # no CUDA call here: a rank that only serves RPCs never touches the GPU
    _call_keeping_locals(fn, Worker(rank, plan["world_size"], rank, placement.backend, placement.device(rank),
                                    plan["init_method"], plan["rpc_init_method"], placement, method), *args)
    _leave_now()


_KEPT_FRAMES: list = []  # the frame of each rank's function, kept with its objects until the process ends


def _call_keeping_locals(fn, *args) -> None:
    """``fn(*args)``, keeping the objects its frame held when it returned alive until :func:`_leave_now` ends the
    process. Freed at the return, in the order of fn's local variables, they could deadlock: DDP's reducer,
    freed with the GIL held, destroys the gloo process group it holds, which joins its threads, while one of
    them waits for the GIL to free a tensor of a finished collective whose Python reference had just gone
    (torch 2.11: exercise 02a and ddp_mnist.py, now and then, never ended). A profiling hook catches fn's frame
    as fn is entered, then removes itself."""
    code = getattr(fn, "__code__", None)

    def catch(frame, event, arg):
        if event == "call" and frame.f_code is code:
            _KEPT_FRAMES.append(frame)
            sys.setprofile(None)

    if code is not None:
        sys.setprofile(catch)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)


def _leave_now() -> None:
    """A rank whose function returned leaves without the interpreter's teardown, where PyTorch's C++ objects
    and their threads are destroyed in no set order: a rank that had finished its work sometimes aborted there
    ("terminate called without an active exception", exit code -6: in clean-clone make test runs, spawned and
    under torchrun, and once in 129 runs of a 2-rank DDP script on 2 busy cores). Its output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run_as_torchrun_rank(fn, world_size, args, placement, threads) -> None:
    started = int(os.environ["WORLD_SIZE"])
    if world_size != started:
        raise ValueError(f"--world-size is {world_size} but torchrun started {started} workers")
    _prepare_process(threads)
    if os.environ.get("MASTER_ADDR") in LOOPBACK:  # a one-machine torchrun run: keep gloo, TensorPipe, NCCL there too
        os.environ.update(socket_ifnames())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    _call_keeping_locals(fn, Worker(int(os.environ["RANK"]), started, local_rank, placement.backend,
                                    placement.device(local_rank), "env://", "env://", placement), *args)
    _leave_now()  # as a spawned worker does: this process is the rank, and its work is done
