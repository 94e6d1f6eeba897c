"""Stopping cleanly: SIGTERM, SIGUSR1 and Ctrl-C save a checkpoint at the next step boundary, then stop.

Clusters and cloud spot instances announce the end of a job with a signal and a grace period before SIGKILL:
SIGTERM (Slurm's ``scancel``, Kubernetes, systemd, torchrun passing its own SIGTERM on), or SIGUSR1 (Slurm's
``--signal=USR1@120``, chosen by the job script). Ctrl-C in a terminal and the interrupt button of a Jupyter
notebook send SIGINT. During :func:`dit_core.train.train`, :class:`StopSignals` turns each of them into a
request: the step in progress finishes, the loop writes ``last.pt`` (unless it has just done so) and returns
its summary with ``interrupted`` set, and the previous signal handlers are back in place. Nothing raises
through a notebook cell, and ``dit-train --resume true`` continues bit for bit. A second Ctrl-C stops at once
(``KeyboardInterrupt``: the last checkpoint written stays intact, the atomic writes see to that).

Under torchrun every process gets the signal, but not at the same moment, so not after the same step; a
process that stopped alone would leave the others waiting forever in the next gradient all-reduce. So at
every step boundary the processes agree, with one all-reduce (the maximum of their requests) over a gloo
process group: a small exchange between the host processes that never waits for the GPU. They all stop
after the same step, and rank 0 saves.

DataLoader worker processes ignore these signals (:func:`ignore_stop_signals`, their ``worker_init_fn``):
the terminal sends Ctrl-C to the whole process group, and a worker that died of it would break the very step
that should finish; the main process ends them when it stops.
"""

from __future__ import annotations

import signal
import sys
import threading

import torch

#: The signals that request a clean stop (SIGUSR1 does not exist on Windows).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGINT") if hasattr(signal, name))


def ignore_stop_signals(worker_id: int = 0) -> None:
    """A DataLoader ``worker_init_fn``: the worker ignores the stop signals (its parent handles them)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class StopSignals:
    """A context manager that, while active, records stop signals instead of dying of them.

    ``requested`` is the name of the first signal received (None before); :meth:`agreed` is what the loop
    asks at each step boundary. Outside the main thread (where Python cannot install handlers) it does
    nothing and the signals keep their usual effect.
    """

    def __init__(self, procs=None):
        self.procs = procs
        self.requested: str | None = None
        self._previous: dict = {}
        self._group = None

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        if self.procs is not None and self.procs.distributed:
            import torch.distributed as dist

            # NCCL collectives run on the GPU's stream; the stop flag is a host matter, so it goes over gloo
            self._group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the handlers back that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            if signum == getattr(signal, "SIGINT", None):  # a second Ctrl-C: stop now
                self.restore()
                raise KeyboardInterrupt(f"second {name}: stopped at once")
            return  # already stopping
        self.requested = name
        again = " (Ctrl-C again to stop at once, without saving)" if name == "SIGINT" else ""
        print(f"\n{name} received: finishing this step, saving a checkpoint, then stopping{again}",
              file=sys.stderr, flush=True)

    def agreed(self) -> str | None:
        """Whether to stop after this step: this process's request, or, under torchrun, any process's (all
        of them get the same answer at the same step)."""
        if self._group is None:
            return self.requested
        import torch.distributed as dist

        mine = STOP_SIGNALS.index(getattr(signal, self.requested)) + 1 if self.requested else 0
        flag = torch.tensor([mine], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        code = int(flag.item())  # a CPU tensor: no GPU synchronisation
        if code and self.requested is None:
            self.requested = signal.Signals(STOP_SIGNALS[code - 1]).name + " (on another process)"
        return self.requested


def exit_code(requested: str | None) -> int:
    """The exit status of a run stopped by ``requested``: 128 + the signal number, as for a process killed by
    it, so that job scripts see an unfinished run (0 when it finished)."""
    if not requested:
        return 0
    name = requested.split()[0]
    return 128 + int(getattr(signal, name, signal.SIGTERM))
