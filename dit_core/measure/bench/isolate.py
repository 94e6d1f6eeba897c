"""One rung in a fresh process, so that its peak memory is its own; and the process's memory, read.

:func:`measure_rung_isolated` starts ``python -m dit_core.measure.bench --child PAYLOAD``, which runs
:func:`dit_core.measure.bench.ladder.measure_rung` and prints its row as one marked JSON line. On the CPU the
row's peak is then the peak resident set size of that process alone (:func:`peak_rss_bytes`, ``VmHWM``).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

#: The line prefix of a child's result on its standard output.
RESULT_MARK = "DIT-BENCH-RESULT "


def _proc_status(field: str) -> int | None:
    """A memory line of /proc/self/status in bytes (Linux), e.g. VmRSS (now) or VmHWM (peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_bytes() -> int | None:
    """The resident set size of this process now (Linux), or None."""
    return _proc_status("VmRSS")


def peak_rss_bytes() -> int:
    """The peak resident set size of this process so far."""
    peak = _proc_status("VmHWM")
    if peak is not None:
        return peak
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def measure_rung_isolated(spec, rung, timeout: float | None = None) -> dict:
    """Run one rung (a :class:`~dit_core.measure.bench.rungs.Rung`) of ``spec`` in a fresh Python process and
    return its row; a timeout or a crash is a row with that status."""
    payload = json.dumps({"spec": asdict(spec), "rung": asdict(rung)})
    cmd = [sys.executable, "-m", "dit_core.measure.bench", "--child", payload]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])  # the child imports this dit_core
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(rung=rung.key, label=rung.label, status=f"timeout after {timeout:g} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return dict(rung=rung.key, label=rung.label, status=f"error: exit {proc.returncode}: {' | '.join(tail)[:300]}")
