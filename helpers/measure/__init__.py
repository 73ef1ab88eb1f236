"""How the course measures: one module per thing measured, one implementation of each.

* ``timing``: time. ``clock`` and ``Laps`` (seconds per phase, waiting for the GPU); ``Timeline`` (when each
  micro-batch ran forward and backward, in wall-clock seconds that processes share: lesson 05);
  ``profiler_rows`` (a ``torch.profiler`` run as rows to draw: lesson 12); ``OpCount`` (the operations a step
  dispatches: lesson 15); ``fit_alpha_beta`` (lesson 01's fit of a message's latency and bandwidth).
* ``memory``: bytes. What tensors hold on a rank (``local_bytes``, ``storage_bytes``, ``optimizer_bytes``),
  what autograd saves for backward (``SavedTensorBytes``), the CUDA allocator's peak (``peak_memory``).
* ``comms``: collectives. ``CollectiveLog`` records each one a process launches (kind, dtype, payload
  bytes); ``kind`` and ``plain_name`` name an operator.
* ``process``: what a process spends and opens. CPU seconds and page faults (``process_usage``), glibc's
  malloc arenas, the TCP sockets a run listens on (``ListenerLog``, ``own_listeners``), a live process's
  Python stacks (``py_spy_dumps``).

Measuring changes nothing it measures: hooks hand back the tensor they were given, the log calls the collective
it saw. Where a measurement needs what a system lacks (glibc, root), it prints one line and returns None.
"""
