"""Start scripts from a process that has already imported torch (Linux, no GPU present).

Every ``python script.py`` pays for importing torch (and, for DDP, ``torch._dynamo``) before its first line
runs: seconds on a small CPU, on every run of every cell. :func:`start` hands the script instead to a *warm
starter*: one server process per caller (the notebook's kernel, a test session) that imported those modules
once and forks a child for each script. The child becomes what ``python -u script args`` would have been: its
own OS session (so :func:`helpers.runner.kill_group` ends it and every worker it starts), the caller's working
folder and environment, ``sys.argv``, stdin from ``/dev/null``, stdout and stderr into one pipe the caller
reads, the script run as ``__main__``, and its exit code back to the caller. It leaves as the interpreter would,
less the teardown of the modules it inherited (about a second of CPU with torch loaded): its threads joined,
its exit handlers run, its output flushed (:func:`_leave`).

The warm path is taken only where it is the same as a fresh interpreter (:func:`usable`): on Linux, with no
GPU device present (the CUDA runtime does not survive a fork). The server imports under the request's
import-time environment (``PYTHON*``, ``OMP_*``, ``TORCH_*``, ...); a request with another one replaces it
(or, while one of its scripts runs, gets a fresh interpreter). Where :func:`start` returns None the caller
starts a fresh interpreter, as before. :func:`share` lends a process's starter to the processes it starts
(the Jupyter kernels of ``make test`` and ``make course``), so that they do not each import torch again.
The server holds no run's state, starts no thread, touches no GPU, ignores Ctrl-C (a child gets the default
handlers back), and ends when its caller does.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

# what a script would otherwise import first, at about a second each on 2 cores (dynamo: DDP's first use)
PRELOAD = ("torch", "torch.distributed", "torch.distributed.rpc", "torch.distributed.autograd",
           "torch.distributed.optim", "torch.nn.parallel", "torch.multiprocessing", "torch._dynamo",
           "numpy", "helpers", "helpers.launch", "helpers.flags", "helpers.metrics", "helpers.compare")
# environment read while those modules load, or as a process starts (the interpreter's, the C library's
# MALLOC_*): a run that sets one of these differently from the server gets a fresh interpreter
IMPORT_TIME = re.compile(r"^(PYTHON|OMP_|MKL_|KMP_|GOMP_|OPENBLAS_|LD_|MALLOC_|GLIBC_TUNABLES|TORCH|PYTORCH_|CUDA_|"
                         r"NCCL_|HIP_|ROCM_)")
# the part of it a process reads only as it starts (the interpreter, the loader, glibc's malloc, OpenMP, BLAS)
PROCESS_START = re.compile(r"^(PYTHON|LD_|MALLOC_|GLIBC_TUNABLES|OMP_|GOMP_|KMP_|MKL_|OPENBLAS_)")
GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")

SHARED = "COURSE_WARM_SOCKET"  # the address of a starter lent by an ancestor process (see share())

_lock = threading.Lock()
_server: dict = {}  # pid -> the caller's server: {"proc", "path", "environment"}
_shared: dict = {}  # pid -> the server this process lends (share()), which nothing replaces
_lent: dict = {}  # pid -> {script pid: its WarmProcess} of the scripts a lent starter forked for this process


def environment_read(env, pattern=IMPORT_TIME) -> dict:
    """The variables of ``env`` that a process reads at import time (``pattern`` IMPORT_TIME) or as it starts
    (PROCESS_START)."""
    return {k: v for k, v in env.items() if pattern.match(k)}


def usable(env=None) -> bool:
    """True where a forked child is the same as a fresh ``python``: Linux, no GPU device present, and
    ``COURSE_WARM`` not ``0`` in ``env`` (default: this process's environment)."""
    env = os.environ if env is None else env
    return sys.platform == "linux" and not any(os.path.exists(p) for p in GPU_DEVICES) \
        and env.get("COURSE_WARM", "1") != "0"


def fresh_seeds() -> None:
    """Seed PyTorch's and numpy's global generators from the OS, as a fresh interpreter does; a forked process
    would otherwise share its parent's (Python's own generator reseeds itself on fork)."""
    sys.modules["torch"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def server_pids() -> set[int]:
    """The pids of the warm starters this process started and that still run (its own and the one it lends):
    tests leave them out of their process counts."""
    entries = (_server.get(os.getpid()), _shared.get(os.getpid()))
    return {e["proc"].pid for e in entries if e and e["proc"].poll() is None}


def lent_scripts() -> list[int]:
    """The pids of this process's scripts that a starter lent by an ancestor forked and that still run: they
    are not this process's children, but they count as such (:func:`helpers.runner.running_children`)."""
    scripts = _lent.get(os.getpid(), {})
    for pid in [pid for pid, proc in scripts.items() if proc.poll() is not None]:
        del scripts[pid]
    return list(scripts)


def share() -> str | None:
    """Start a starter for this process's environment and lend it to every process started from here on
    (its address in ``os.environ[SHARED]``): a Jupyter kernel that runs a lesson then forks its scripts from
    it instead of starting a starter of its own, which would import torch once more. A process whose
    import-time environment differs is refused by it and starts its own. Returns the address, or None where
    no starter can be used (:func:`usable`)."""
    if not usable():
        return None
    with _lock:
        entry = _shared.get(os.getpid())
        if entry is None or entry["proc"].poll() is not None:
            entry = _start_server({**os.environ, "PYTHONUNBUFFERED": "1"})  # what run_script's requests carry
            if entry is None:
                return None
            _shared[os.getpid()] = entry
    os.environ[SHARED] = entry["path"]
    return entry["path"]


def _ensure_server(env: dict) -> dict | None:
    """This caller's starter for ``env``'s import-time environment: the running one, or a new one that replaces
    it when it imported under another environment and runs no script (None while it runs one)."""
    with _lock:
        entry = _server.get(os.getpid())
        if entry and entry["proc"].poll() is None:
            if entry["environment"] == environment_read(env):
                return entry
            if entry["running"]:
                return None
            entry["proc"].kill()
            entry["proc"].wait()
            shutil.rmtree(os.path.dirname(entry["path"]), ignore_errors=True)
        entry = _start_server(env)
        if entry is not None:
            _server[os.getpid()] = entry
        return entry


def _start_server(env: dict) -> dict | None:
    """A new starter that imported under ``env``, once it is ready; None if it failed to start."""
    folder = tempfile.mkdtemp(prefix="course-warm-")  # 0700: only this user can connect
    path = os.path.join(folder, "socket")
    proc = subprocess.Popen([sys.executable, "-m", "helpers.warm", path, str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True, text=True, env={k: v for k, v in env.items() if k != SHARED})
    ready = proc.stdout.readline().strip()  # the server says "ready" once its imports are done
    proc.stdout.close()
    if ready != "ready":
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return {"proc": proc, "path": path, "environment": environment_read(env), "running": 0}


class WarmProcess:
    """The part of :class:`subprocess.Popen` that :func:`helpers.runner.run_script` uses, for a forked script."""

    def __init__(self, conn: socket.socket, pid: int, stdout, entry: dict):
        self._conn, self.pid, self.stdout, self.returncode = conn, pid, stdout, None
        self._buffer, self._entry = b"", entry
        self._reading = threading.Lock()  # poll() from one thread (lent_scripts) while wait() blocks in another

    def _read(self, block: bool) -> None:
        if self.returncode is not None or not self._reading.acquire(blocking=block):
            return  # ended, or another thread is reading: it will see the exit
        try:
            while self.returncode is None:
                try:
                    data = self._conn.recv(64, 0 if block else socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return
                self._buffer += data
                if b"\n" in self._buffer or not data:  # no data: the server went away without reporting the exit
                    line = self._buffer.split(b"\n")[0]
                    self.returncode = int(line.split()[1]) if line.startswith(b"exit ") else -signal.SIGKILL
                    self._conn.close()
                    with _lock:
                        self._entry["running"] -= 1
        finally:
            self._reading.release()

    def poll(self):
        self._read(block=False)
        return self.returncode

    def wait(self, timeout=None):
        self._read(block=True)
        return self.returncode


def start(argv: list[str], cwd, env: dict):
    """Start ``python -u *argv`` (``argv[0]`` the script) from the warm starter; a :class:`WarmProcess` whose
    ``stdout`` carries the script's stdout and stderr as text, or None where a fresh interpreter is needed."""
    if not usable(env):
        return None
    with _lock:
        own = _server.get(os.getpid())
        own = own if own and own["proc"].poll() is None and own["environment"] == environment_read(env) else None
    lent = os.environ.get(SHARED)
    if own is None and lent:  # a starter lent by an ancestor (or by this process): it refuses another environment
        proc = _request({"path": lent, "running": 0}, argv, cwd, env)
        if proc is not None:
            _lent.setdefault(os.getpid(), {})[proc.pid] = proc
            return proc
    entry = own or _ensure_server(env)
    return None if entry is None else _request(entry, argv, cwd, env)


def _request(entry: dict, argv: list[str], cwd, env: dict):
    """Ask the starter of ``entry`` to fork the script: its WarmProcess, or None if it refused or is gone."""
    read, write = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(entry["path"])
        request = json.dumps({"argv": [str(a) for a in argv], "cwd": os.path.abspath(cwd or "."), "env": env})
        socket.send_fds(conn, [request.encode()], [write])
        reply = b""
        while not reply.endswith(b"\n"):
            data = conn.recv(64)
            if not data:
                raise ConnectionError("the warm starter closed the connection")
            reply += data
    except OSError:
        conn.close()
        os.close(read)
        return None
    finally:
        os.close(write)
    if not reply.startswith(b"pid "):  # "refused": it imported under another environment
        conn.close()
        os.close(read)
        return None
    stdout = open(read, encoding=None, errors="replace", newline=None)
    with _lock:
        entry["running"] += 1
    return WarmProcess(conn, int(reply.split()[1]), stdout, entry)


# --- the server ---------------------------------------------------------------------------------------------


def _serve(path: str, parent: int) -> int | None:
    """Accept requests until the caller ``parent`` is gone. In a forked child, return the script's exit code."""
    import importlib

    imported_under = environment_read(os.environ)  # before the imports, which may set some (torch does)
    for name in PRELOAD:
        importlib.import_module(name)
    # what the imports set (dynamo: TORCHINDUCTOR_CACHE_DIR, to its default): a caller that imported them too
    # carries the same values, with which a fresh interpreter starts as it would without them
    set_by_imports = {k: v for k, v in environment_read(os.environ).items() if k not in imported_under}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal or a kernel interrupt is not for us
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w.fileno())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    running: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is wake_r:
                while True:
                    try:
                        if not wake_r.recv(512):
                            break
                    except BlockingIOError:
                        break
                continue
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
            request = json.loads(message)
            requested = {k: v for k, v in environment_read(request["env"]).items() if set_by_imports.get(k) != v}
            if requested != imported_under:  # a lent starter serves its own environment
                os.close(fds[0])
                conn.sendall(b"refused\n")
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:  # the script's process: drop the server's state, keep only what the script needs
                signal.set_wakeup_fd(-1)
                for name in (signal.SIGINT, signal.SIGCHLD, signal.SIGTERM):
                    signal.signal(name, signal.default_int_handler if name == signal.SIGINT else signal.SIG_DFL)
                selector.close()
                for s in (listener, wake_r, wake_w, conn, *running.values()):
                    s.close()
                return _become(request, fds[0])
            os.close(fds[0])
            conn.sendall(f"pid {pid}\n".encode())
            running[pid] = conn
        while running:  # report every child that has ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = running.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()
    listener.close()
    os.remove(path)
    os.rmdir(os.path.dirname(path))
    return None


def _become(request: dict, out: int) -> int:
    """Turn this forked child into ``python -u script args`` as the request describes; return its exit code."""
    import io
    import runpy
    import traceback

    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    module = argv[1] if argv[0] == "-m" else None  # python -m module args (a Jupyter kernel: helpers.kernel)
    sys.argv = [module, *argv[2:]] if module else list(argv)  # run_module puts the module's file first
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0]))
    import multiprocessing.process

    multiprocessing.process.ORIGINAL_DIR = os.getcwd()  # where a spawned worker finds a relative script path
    fresh_seeds()
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.abspath(argv[0]), run_name="__main__")
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 (what the interpreter would print, then its exit code)
        traceback.print_exc()
        return 1


def _leave(code: int) -> None:
    """End a script's process as the interpreter would after the script's last line, less the teardown of its
    modules: with torch and dynamo imported, that teardown takes about a second of CPU (0.9 s on 2 cores, in
    every copy, as in every fresh ``python``), spent on objects the process is about to lose anyway. First what
    the interpreter does before it: wait for the script's non-daemon threads, run its exit handlers
    (``atexit``: multiprocessing's, ``weakref.finalize``'s, logging's), flush its output. What is not done:
    finalizing the objects still alive (``__del__``), which Python does not promise at exit either."""
    import atexit

    threading._shutdown()  # the interpreter's own first step at exit: join the non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the script, or its reader gone
            pass
    os._exit(code)


if __name__ == "__main__":
    code = _serve(sys.argv[1], int(sys.argv[2]))
    if code is not None:  # in a script's process
        _leave(code)
