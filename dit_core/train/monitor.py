"""Watching a run: a progress bar, metric records, TensorBoard, memory, the end-of-run summary.

Only process 0 writes anything. Every ``log_every`` steps one record goes to ``<out>/metrics.jsonl`` (one
JSON object per line: easy to load with pandas or a few lines of Python), to TensorBoard (``<out>/tb``;
``tensorboard --logdir <out>/tb``) and to the console; the tqdm bar shows the loss, steps/s and images/s
all the time. Throughput is measured over the steps since the previous record, leaving out time spent on
checkpoints and sample grids.

Each record also says where the time and the memory went, so a loader bottleneck or a card near its limit shows
in the log without ``watch nvidia-smi``: ``data_wait_share`` is the share of the interval's wall time the training
process spent waiting for the next batch (the loop fetches batches through :meth:`Monitor.timed`; the step does not
wait for the GPU, so when the GPU is the bottleneck the process waits elsewhere and this share stays near 0, and when
the loader is, the process waits here while the GPU runs out of queued work), ``memory_gb`` the memory in use
at the end of the interval and ``peak_memory_gb`` the peak since the run started (on a GPU: tensors allocated by
torch; on the CPU: the process's resident memory), both in GiB (2^30 bytes), whatever the field names say.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path

import torch

from ..atomic import atomic_write_text


def memory_gb(device: torch.device) -> float:
    """GPU memory allocated by torch now; on the CPU, the process's resident memory now (Linux), else its peak."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**30
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**30
    except (OSError, ValueError, IndexError):
        return peak_memory_gb(device)


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch on a GPU; peak resident memory of the process on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss_kb / 2**20 if sys.platform != "darwin" else rss_kb / 2**30


class Monitor:
    def __init__(self, out: Path, enabled: bool, start_step: int, max_steps: int, batch_size: int,
                 device: torch.device, log_every: int, tensorboard: bool, progress: bool):
        self.enabled, self.device = enabled, device
        self.batch_size, self.log_every = batch_size, max(1, log_every)
        self.step = start_step
        self.last_record = None
        self._window_start, self._window_steps, self._paused = time.perf_counter(), 0, 0.0
        self._loss_sum = self._loss_count = None  # the loss summed over the steps since the last record
        self._data_wait = 0.0
        self.bar = self.jsonl = self.tb = None
        if not enabled:
            return
        self.jsonl = _open_records(Path(out) / "metrics.jsonl", start_step)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step: a resumed run replaces what the interrupted one logged after its checkpoint
                self.tb = SummaryWriter(str(Path(out) / "tb"), purge_step=start_step or None)
            except ImportError:
                print("tensorboard is not installed: metrics go to metrics.jsonl only", file=sys.stderr)
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=max_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)

    def set_total(self, max_steps: int) -> None:
        """The run's length changed (a time budget decided it): the progress bar's total follows."""
        if self.bar is not None:
            self.bar.total = max_steps
            self.bar.refresh()

    def timed(self, batches):
        """``batches`` (an iterable of batches) as an iterator that adds the time spent waiting in ``next()`` to
        the current interval's data wait."""
        it = iter(batches)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self._data_wait += time.perf_counter() - t0
            yield batch

    def pause(self):
        """Call around work that is not training (checkpoints, samples) to keep it out of the throughput."""
        return _Pause(self)

    def update(self, step: int, loss, lr: float, grad_norm, skipped: int, extra: dict, force: bool = False) -> None:
        """Record one finished optimizer step (``step`` counts steps done, from 1); a record is written every
        ``log_every`` steps and when ``force`` is set (the last step). ``loss`` and ``grad_norm`` may be tensors
        on the device: they are summed there and read once per record (reading a GPU number waits for the GPU)."""
        self.step = step
        self._window_steps += 1
        loss = torch.as_tensor(loss, dtype=torch.float32).detach().float()
        finite = torch.isfinite(loss)
        self._loss_sum = torch.where(finite, loss, 0.0) + (self._loss_sum if self._loss_sum is not None else 0.0)
        self._loss_count = finite.long() + (self._loss_count if self._loss_count is not None else 0)
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
        if step % self.log_every and not force:
            return
        norm = torch.as_tensor(math.nan if grad_norm is None else grad_norm).detach().float().to(loss.device)
        loss_sum, count, grad_norm = torch.stack([self._loss_sum, self._loss_count.float(), norm]).tolist()
        elapsed = time.perf_counter() - self._window_start - self._paused
        sps = self._window_steps / elapsed if elapsed > 0 else float("nan")
        record = {
            "step": step,
            "loss": loss_sum / count if count else float("nan"),
            "lr": lr,
            "grad_norm": grad_norm,
            "steps_per_s": sps,
            "images_per_s": sps * self.batch_size,
            "skipped_steps": skipped,
            "data_wait_share": min(1.0, self._data_wait / elapsed) if elapsed > 0 else float("nan"),
            "memory_gb": memory_gb(self.device),
            "peak_memory_gb": peak_memory_gb(self.device),
            "time": time.time(),
            **extra,
        }
        self.last_record = record
        self.jsonl.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for key, value in record.items():
                if key not in ("step", "time") and isinstance(value, (int, float)):
                    self.tb.add_scalar(f"train/{key}", value, step)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", it_s=f"{sps:.2f}", img_s=f"{sps * self.batch_size:.0f}",
                                 data_wait=f"{record['data_wait_share']:.0%}", mem=f"{record['memory_gb']:.1f}G")
        else:
            print(f"step {step:>7d}  loss {record['loss']:.4f}  lr {lr:.2e}  {sps:.2f} steps/s  "
                  f"{sps * self.batch_size:.0f} img/s  data wait {record['data_wait_share']:.0%}  "
                  f"memory {record['memory_gb']:.2f} GiB (peak {record['peak_memory_gb']:.2f})", flush=True)
        self._window_start, self._window_steps, self._paused = time.perf_counter(), 0, 0.0
        self._loss_sum = self._loss_count = None
        self._data_wait = 0.0

    def write(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def image(self, tag: str, path: Path, step: int) -> None:
        if self.tb is None:
            return
        import numpy as np
        from PIL import Image

        arr = np.asarray(Image.open(path).convert("RGB"))
        self.tb.add_image(tag, arr, step, dataformats="HWC")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()


def _open_records(path: Path, start_step: int):
    """``metrics.jsonl`` for appending, holding only the records of steps up to ``start_step``: a fresh run
    starts it empty, a resumed one drops what the interrupted run logged after its last checkpoint."""
    kept = []
    if start_step and path.exists():
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= start_step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
    path.write_text("".join(line + "\n" for line in kept))
    return open(path, "a", buffering=1)


class _Pause:
    def __init__(self, monitor: Monitor):
        self.monitor = monitor

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.monitor._paused += time.perf_counter() - self.t0


def format_summary(summary: dict) -> str:
    """The end-of-run summary as a few aligned lines."""
    lines = ["", "== dit-train summary " + "=" * 50]
    for key, value in summary.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        lines.append(f"  {key:<22} {value}")
    return "\n".join(lines)


def write_summary(out: Path, cfg, procs, monitor: Monitor, *, steps: int, steps_this_run: int, loss: float,
                  skipped_steps: int, started: float, loop_started: float, precision: str, samples, resumed_from,
                  interrupted) -> dict:
    """The end-of-run summary: written to ``<out>/summary.json`` and printed by process 0, with how to continue a
    stopped run. ``loss`` stands in for the final loss when no record was logged; ``started`` and
    ``loop_started`` are the ``time.perf_counter()`` of the run's start and of its first step."""
    train_seconds = time.perf_counter() - loop_started
    summary = {
        "steps": steps,
        "steps_this_run": steps_this_run,
        "final_loss": (monitor.last_record or {}).get("loss", loss),  # the last logged average
        "skipped_steps": skipped_steps,
        "wall_seconds": time.perf_counter() - started,
        "train_seconds": train_seconds,
        "images_per_s": steps_this_run * cfg.batch_size / train_seconds if steps_this_run else 0.0,
        "precision": precision,
        "device": str(procs.device),
        "threads": torch.get_num_threads(),  # torch's CPU threads (the config's threads, if set)
        "processes": procs.world_size,
        "peak_memory_gb": peak_memory_gb(procs.device),
        "checkpoint": str(out / "checkpoints" / "last.pt"),
        "samples": str(samples) if samples else None,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "interrupted": interrupted,
    }
    if procs.is_main:
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        print(format_summary(summary), flush=True)
        if interrupted is not None:
            print(f"\nstopped by {interrupted} after step {steps} of {cfg.max_steps}: checkpoint saved to "
                  f"{summary['checkpoint']}.\nContinue with: dit-train --config {out / 'config.yaml'} --resume true",
                  flush=True)
    return summary
