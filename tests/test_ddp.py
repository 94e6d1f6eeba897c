"""DistributedDataParallel on the CPU: 2 processes (gloo) train the same model as 1 process with the same global
batch. The CLI runs under ``torchrun`` exactly as a multi-GPU user would start it, and starts its own processes
when ``cpu_processes`` asks (through torchrun: dit_core.cli.train.run_processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from test_train import REPO, TINY_ARGS, child_env

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "dit_core.train"]
LAUNCHED = [sys.executable, "-m", "dit_core.train", "--cpu-processes", "2"]  # dit-train starts the 2 processes


NO_MUON = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="optimizer muon needs torch>=2.9")


@pytest.mark.parametrize("how,optimizer", [("torchrun", "adamw"), ("cpu_processes", "adamw"),
                                           pytest.param("cpu_processes", "muon", marks=NO_MUON)])
def test_two_processes_equal_one_process(tmp_path, how, optimizer):
    """With Muon too (its state is that of PyTorch's Muon and AdamW)."""
    from dit_core.data import export_digits

    data = export_digits(tmp_path / "digits")
    common = ["--data-path", str(data), *TINY_ARGS, "--batch-size", "16", "--max-steps", "6", "--log-every", "2",
              "--class-dropout-prob", "0.5", "--optimizer", optimizer]
    two = subprocess.Popen([*(TORCHRUN if how == "torchrun" else LAUNCHED), *common, "--out", str(tmp_path / "two")],
                           env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    one = subprocess.Popen([sys.executable, "-m", "dit_core.train", *common, "--out", str(tmp_path / "one")],
                           env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out_two, _ = two.communicate(timeout=300)
    out_one, _ = one.communicate(timeout=300)
    assert two.returncode == 0, out_two
    assert one.returncode == 0, out_one

    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (s1["processes"], s2["processes"]) == (1, 2) and s1["steps"] == s2["steps"] == 6
    if how == "cpu_processes":
        assert "2 processes on the CPU" in out_two and out_two.count("dit-train summary") == 1, out_two

    a = torch.load(tmp_path / "one" / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    b = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert a["data"] == b["data"]  # the same images were seen
    # Not bit-identical: DDP averages per-process gradient means (sum over 8 images / 8, then over 2 ranks / 2)
    # where one process sums 16 images / 16, so float additions happen in another order (~1e-8 relative). These
    # fp32 runs take Muon's fp32 iteration (MuonFp32, whose two processes share the matrices out), which keeps
    # the difference as small as AdamW's (measured: at most 6e-8 after 6 steps).
    for key in ("model", "ema"):
        for name, value in a[key].items():
            torch.testing.assert_close(b[key][name], value, rtol=0, atol=1e-6, msg=lambda m: f"{key}.{name}: {m}")
    # the logged loss is the average over both processes, so the two logs agree too
    log = lambda run: [json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    torch.testing.assert_close(torch.tensor(log("two")), torch.tensor(log("one")), rtol=1e-5, atol=1e-6)
    assert len(log("two")) == 3  # rank 0 alone writes the records (steps 2, 4, 6)


def test_a_launched_run_passes_sigterm_on_and_every_process_stops_after_saving(tmp_path):
    """SIGTERM to the dit-train that started the processes: both stop after the same step, rank 0 saves, the exit
    status is 128 + 15, and no process is left."""
    from dit_core.data import export_digits

    data = export_digits(tmp_path / "digits")
    out = tmp_path / "run"
    args = ["--data-path", str(data), *TINY_ARGS, "--batch-size", "16", "--max-steps", "100000", "--log-every", "1",
            "--ckpt-every", "100000", "--out", str(out)]
    proc = subprocess.Popen([*LAUNCHED, *args], env=child_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, text
    assert "Traceback" not in text and "failed" not in text, text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and summary["processes"] == 2
    state = torch.load(out / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert state["step"] == summary["steps"] >= 3
    assert [cmd for cmd in command_lines() if str(out) in cmd] == []  # no process left behind


def command_lines() -> list[str]:
    """The command lines of this machine's processes (Linux /proc)."""
    lines = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ValueError):
            continue
    return lines


def test_how_many_processes_dit_train_starts(monkeypatch):
    from dit_core.train import make_config
    from dit_core.cli.train import planned_processes

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = lambda **kw: make_config(None, {"device": "cpu", "batch_size": 32, **kw})
    assert planned_processes(cfg(), usable=2) == 1  # the default: one process
    assert planned_processes(cfg(cpu_processes=0), usable=2) == 2  # one per usable core
    assert planned_processes(cfg(cpu_processes=0), usable=64) == 32  # at least one image each
    assert planned_processes(cfg(cpu_processes=3, batch_size=32), usable=4) == 2  # the batch splits evenly
    assert planned_processes(cfg(cpu_processes=2, batch_size=32, grad_accum=16), usable=2) == 2
    assert planned_processes(cfg(cpu_processes=2, debug=True), usable=2) == 1
    monkeypatch.setenv("WORLD_SIZE", "2")  # started by torchrun (or by dit-train): not again
    assert planned_processes(cfg(cpu_processes=0), usable=2) == 1
