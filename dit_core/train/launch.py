"""Both cores of a laptop: ``dit-train`` starts its own processes on the CPU (the ``cpu_processes`` key).

A small DiT keeps one CPU core busy but not two: its matrix products (64 tokens of width 128 per image in the
``small-images`` profile) are too small for torch's threads to share well. Measured on a 2-core Intel Xeon
(session 10, ``small-images``, 32 images a step, fp32, nothing else running): one process with 2 threads ran
3.8 steps/s over a 584 s run, one process with 1 thread 4.5 steps/s, and two processes with 1 thread each (16
images each, DistributedDataParallel over gloo) 6.5 steps/s, 1.7x the first. The processes compute what one
process computes (:mod:`dit_core.train.distributed`: the random draws are made for the global batch and
sliced), so the run is the same run: the loss at step 400 was 0.1571 both ways.

``torchrun --nproc_per_node N -m dit_core.train ...`` does the same, and a run started by torchrun is left
alone. Here :func:`run_processes` is a small torchrun for one machine:

* the children re-read the same command line with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
  and ``MASTER_PORT`` set (a free local port), and ``OMP_NUM_THREADS`` = usable cores / N;
* rank 0 writes to the terminal; the others' output is kept and shown only if they fail;
* the children run in their own session, so Ctrl-C reaches them once, through the parent, which passes
  SIGINT, SIGTERM and SIGUSR1 on (:mod:`dit_core.train.preempt`: they agree on a step, rank 0 saves);
* when one child fails, the others get a grace period to notice, then are stopped, so nothing hangs in an
  all-reduce that can never complete.

The Python API (:func:`dit_core.train.train`) always trains in the calling process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .config import TrainConfig

#: Seconds the other processes get to end by themselves after one has failed.
GRACE_S = 30.0
#: The signals passed on to the children (SIGUSR1 does not exist on Windows).
FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name))


def planned_processes(cfg: TrainConfig, usable: int | None = None) -> int:
    """How many processes ``dit-train`` should start for ``cfg``: 1 unless the run is on the CPU, was not
    started by torchrun (or by this module), and ``cpu_processes`` asks for more (0: one per usable core).
    Each process needs at least one image of every micro-batch, and the batch must split evenly."""
    if "WORLD_SIZE" in os.environ or cfg.cpu_processes == 1 or cfg.debug:
        return 1
    from ..runtime import resolve_device, usable_cores

    if resolve_device(cfg.device).type != "cpu":
        return 1
    n = cfg.cpu_processes or (usable if usable is not None else usable_cores())
    per_step = cfg.batch_size // max(1, cfg.grad_accum)
    n = min(n, per_step)
    while n > 1 and per_step % n:
        n -= 1
    return max(1, n)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the rendezvous of the children)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(rank: int, n: int, port: int, threads: int) -> dict:
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads))
    return env


def run_processes(n: int, argv: list[str], usable: int | None = None) -> int:
    """Train in ``n`` processes on this machine, each running ``python -m dit_core.train ARGV``; the exit code
    is rank 0's, or the first failing child's when rank 0 succeeded."""
    from ..runtime import usable_cores

    threads = max(1, (usable if usable is not None else usable_cores()) // n)
    port = free_port()
    print(f"dit-train: {n} processes on the CPU, {threads} thread(s) each (DDP over gloo; cpu_processes: 1 "
          "trains in one)", flush=True)
    command = [sys.executable, "-m", "dit_core.train", *argv]
    logs, children = [], []
    try:
        for rank in range(n):
            log = None if rank == 0 else tempfile.TemporaryFile(mode="w+")
            logs.append(log)
            children.append(subprocess.Popen(command, env=child_env(rank, n, port, threads), stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT if log else None,
                                             start_new_session=True))
        return _wait(children, logs)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for log in logs:
            if log is not None:
                log.close()


def _wait(children: list[subprocess.Popen], logs: list) -> int:
    def forward(signum, frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        failed_at = None
        while any(child.poll() is None for child in children):
            codes = [child.poll() for child in children]
            if failed_at is None and any(code not in (None, 0) for code in codes):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                for child in children:
                    if child.poll() is None:
                        child.kill()
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = [child.returncode for child in children]
    for rank, (code, log) in enumerate(zip(codes, logs)):
        # what every process meets alike (a setting, the data, a stop signal) rank 0 has reported already
        if log is not None and code and code != codes[0]:
            log.seek(0)
            tail = log.read()[-4000:]
            print(f"dit-train: process {rank} of {len(children)} failed (exit code {code}):\n{tail}", file=sys.stderr)
    return _status(codes[0]) if codes[0] else next((_status(code) for code in codes if code), 0)


def _status(code: int) -> int:
    """A child's exit status as a shell reports it: a death by signal N (Popen's -N) is 128 + N."""
    return code if code > 0 else 128 - code
