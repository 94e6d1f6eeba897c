"""Preemption and durability of training: SIGTERM, SIGUSR1 and Ctrl-C save at the next step boundary and stop
cleanly; a resumed run stores exactly what an uninterrupted one does (the whole checkpoint, generator states
included); time-based checkpoints; the 8-bit optimizer's state resumes exactly; the EMA every N steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dit_core.train import ConfigError, train
from dit_core.train.preempt import StopSignals, exit_code

from test_train import (REPO, TINY_ARGS, Blobs, assert_same_checkpoint, child_env, final_state, tiny_config,
                        whole_and_resumed)

# ----------------------------------------------------------------------------------------------------------
# The CLI in a subprocess: signals
# ----------------------------------------------------------------------------------------------------------

STEPS = 100  # the signal comes after step 3; at ~50 ms a step on a busy 2-core machine the run is far from done
COMMON = [*TINY_ARGS, "--hidden-size", "64", "--batch-size", "32", "--max-steps", str(STEPS), "--ckpt-every", "1000",
          "--log-every", "1"]


def start(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "dit_core.train", *args], env=child_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def wait_for_step(proc, step: int, timeout: float = 240) -> list[str]:
    """Read the run's output until it reports ``step`` (log_every 1 prints every step)."""
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.split()[:2] == ["step", str(step)]:
            return lines
    raise AssertionError("the run never reported step %d:\n%s" % (step, "".join(lines)))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, digits_dir):
    out = tmp_path_factory.mktemp("ref") / "run"
    proc = start(["--data-path", str(digits_dir), *COMMON, "--out", str(out)])
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, text
    return final_state(out)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    from dit_core.data import export_digits

    return export_digits(tmp_path_factory.mktemp("data") / "digits")


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_saves_at_the_next_step_and_resume_is_bit_exact(tmp_path, digits_dir, reference, sig):
    """SIGTERM to the trainer (a cluster's notice), or SIGINT to its whole process group (Ctrl-C in a terminal,
    which the DataLoader worker receives too): the step finishes, last.pt is written, the exit status is
    128 + the signal, and the resumed run ends with a checkpoint equal to the uninterrupted run's."""
    out = tmp_path / "run"
    args = ["--data-path", str(digits_dir), *COMMON, "--out", str(out)]
    if sig == "SIGINT":
        args += ["--preload", "false", "--num-workers", "1"]
    proc = start(args, start_new_session=True)
    wait_for_step(proc, 3)
    if sig == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=240)
    assert proc.returncode == 128 + getattr(signal, sig), text
    assert "Traceback" not in text, text
    summary = json.loads((out / "summary.json").read_text())
    stopped = summary["steps"]
    assert summary["interrupted"] == sig and 3 <= stopped < STEPS, summary
    assert final_state(out)["step"] == stopped
    assert f"stopped by {sig} after step {stopped}" in text and "--resume true" in text
    # the records of every step up to the stop are there
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").open()] == list(range(1, stopped + 1))

    resumed = start(["--data-path", str(digits_dir), *COMMON, "--out", str(out), "--resume", "true"])
    text, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, text
    assert_same_checkpoint(reference, final_state(out))


@pytest.mark.slow
def test_sigusr1_saves_and_stops_too(tmp_path, digits_dir):
    out = tmp_path / "run"
    proc = start(["--data-path", str(digits_dir), *COMMON, "--out", str(out)])
    wait_for_step(proc, 2)
    proc.send_signal(signal.SIGUSR1)
    text, _ = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGUSR1, text
    state = final_state(out)
    assert 2 <= state["step"] < STEPS and json.loads((out / "summary.json").read_text())["interrupted"] == "SIGUSR1"


# ----------------------------------------------------------------------------------------------------------
# In this process: a notebook's interrupt, the handlers, the second Ctrl-C
# ----------------------------------------------------------------------------------------------------------


def test_an_interrupted_train_call_returns_after_saving_and_restores_the_handlers(tmp_path, monkeypatch):
    """What a notebook's interrupt button does (SIGINT to the kernel): train() returns its summary, the
    checkpoint is saved, and the cell's signal handlers are the ones it had before."""
    from dit_core.train import step as step_module

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    real_call = step_module.TrainStep.__call__

    def call(self, step, batches):
        if step == 2:  # during the third step
            os.kill(os.getpid(), signal.SIGINT)
        return real_call(self, step, batches)

    monkeypatch.setattr(step_module.TrainStep, "__call__", call)
    summary = train(tiny_config(tmp_path / "nb", max_steps=50, ckpt_every=1000), dataset=Blobs())
    assert summary["interrupted"] == "SIGINT" and summary["steps"] == 3
    assert final_state(tmp_path / "nb")["step"] == 3
    assert {s: signal.getsignal(s) for s in before} == before
    assert exit_code(summary["interrupted"]) == 130 and exit_code(None) == 0
    # and the run continues from there to the end
    monkeypatch.setattr(step_module.TrainStep, "__call__", real_call)
    summary = train(tiny_config(tmp_path / "nb", max_steps=5, ckpt_every=1000, resume="true"), dataset=Blobs())
    assert summary["interrupted"] is None and summary["steps_this_run"] == 2


def test_a_second_ctrl_c_stops_at_once_and_other_signals_are_not_repeated():
    before = signal.getsignal(signal.SIGINT)
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.agreed() == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM: already stopping, nothing more
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs between bytecodes; it raises here
    assert signal.getsignal(signal.SIGINT) is before


# ----------------------------------------------------------------------------------------------------------
# A checkpoint is a pure function of (config, seed, step)
# ----------------------------------------------------------------------------------------------------------


def test_a_resumed_run_stores_exactly_what_an_uninterrupted_one_does(tmp_path):
    """Whole checkpoints compared, the generator states of torch, numpy and Python included (these global
    generators are seeded from the run's seed); the run draws from numpy's and Python's generators in the loop,
    as a library might, to show that they stay in step too."""
    import random

    from dit_core.train import step as step_module

    real_call = step_module.TrainStep.__call__

    def call(self, step, batches):  # something in the loop that uses the global generators
        np.random.rand()
        random.random()
        torch.rand(1)
        return real_call(self, step, batches)

    step_module.TrainStep.__call__ = call
    try:
        train(tiny_config(tmp_path / "ref", max_steps=6, ckpt_every=3), dataset=Blobs())
        train(tiny_config(tmp_path / "split", max_steps=3, ckpt_every=3), dataset=Blobs())
        train(tiny_config(tmp_path / "split", max_steps=6, ckpt_every=3, resume="true"), dataset=Blobs())
    finally:
        step_module.TrainStep.__call__ = real_call
    ref, res = final_state(tmp_path / "ref"), final_state(tmp_path / "split")
    assert ref["rng"]["numpy"]["pos"] == res["rng"]["numpy"]["pos"]
    assert_same_checkpoint(ref, res)


def test_checkpoints_every_few_minutes(tmp_path, monkeypatch):
    from dit_core.train import loop

    saved = []
    real = loop.save_or_explain
    monkeypatch.setattr(loop, "save_or_explain", lambda path, ckpt, *a: (saved.append(ckpt["step"]), real(path, ckpt, *a)))
    train(tiny_config(tmp_path / "a", max_steps=4, ckpt_every=1000), dataset=Blobs())
    assert saved == [4]  # only the last step
    saved.clear()
    train(tiny_config(tmp_path / "b", max_steps=4, ckpt_every=1000, ckpt_every_minutes=1e-9), dataset=Blobs())
    assert saved == [1, 2, 3, 4]  # due at every step boundary
    with pytest.raises(ConfigError, match="ckpt_every_minutes must be >= 0"):
        tiny_config(tmp_path / "c", ckpt_every_minutes=-1)


# ----------------------------------------------------------------------------------------------------------
# 8-bit AdamW
# ----------------------------------------------------------------------------------------------------------


def test_adamw8bit_without_bitsandbytes_says_how_to_install_it(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_bnb(name, *args, **kw):
        if name == "bitsandbytes" or name.startswith("bitsandbytes."):
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_bnb)
    with pytest.raises(ConfigError, match=r'needs bitsandbytes.*pip install -e "\.\[lowmem\]"'):
        train(tiny_config(tmp_path / "r", max_steps=1, optimizer="adamw8bit"), dataset=Blobs())


def test_adamw8bit_trains_and_resumes_exactly(tmp_path):
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install -e \".[lowmem]\")")
    # a layer of >= 4096 weights gets 8-bit moments (smaller ones keep fp32 moments in bitsandbytes)
    kw = dict(optimizer="adamw8bit", hidden_size=64, ckpt_every=3)
    ref, res = whole_and_resumed(tmp_path, **kw)
    assert_same_checkpoint(ref, res)
    states = [s["__bnb_optimizer_quant_state__"] for s in ref["opt"]["state"].values()]
    assert any(s["state1"].dtype == torch.uint8 for s in states)  # 8-bit moments were stored
    assert ref["opt"]["param_groups"][0]["weight_decay"] == 0.0  # DiT's, not bitsandbytes' default 0.01
    assert all(torch.isfinite(v).all() for v in ref["model"].values())


# ----------------------------------------------------------------------------------------------------------
# The EMA every N steps
# ----------------------------------------------------------------------------------------------------------


def test_ema_every_n_steps_is_the_same_average_in_expectation():
    from dit_core.train.ema import EmaUpdater, create_ema

    torch.manual_seed(0)
    model = torch.nn.Linear(100, 100, bias=False)  # 10,000 independent weights: 10,000 trials at once
    decay, steps, mean = 0.9, 400, 3.0
    emas = {}
    for every in (1, 4):
        with torch.no_grad():
            model.weight.fill_(0.0)
        ema = create_ema(model)
        updater = EmaUpdater(ema, model, decay, every=every)
        g = torch.Generator().manual_seed(1)
        history = []
        for step in range(steps):
            with torch.no_grad():
                model.weight.copy_(mean + torch.randn(100, 100, generator=g))
            history.append(model.weight.detach().clone())
            updater(step)
        assert updater.state() == steps // every
        emas[every] = ema.weight.detach()
        if every == 4:  # exactly the closed form: each block of 4 steps weighs (1 - d^4), on its last iterate
            expect = torch.zeros(100, 100)
            for k in range(steps // every):
                expect = decay**4 * expect + (1 - decay**4) * history[(k + 1) * every - 1]
            torch.testing.assert_close(emas[4], expect, rtol=1e-5, atol=1e-5)
    # both are unbiased averages of the same iterates: their means over the trials agree with the true mean
    for every, value in emas.items():
        assert abs(value.mean().item() - mean) < 0.02, (every, value.mean())
    assert emas[4].std() > emas[1].std()  # fewer iterates in the average: a little noisier


def test_ema_every_in_the_trainer(tmp_path):
    train(tiny_config(tmp_path / "e", max_steps=6, ema_every=2), dataset=Blobs())
    assert final_state(tmp_path / "e")["ema_updates"] == 3
    with pytest.raises(ConfigError, match="ema_every must be >= 1"):
        tiny_config(tmp_path / "x", ema_every=0)


def test_cpu_staging_copy_gives_the_same_ema_as_a_plain_copy():
    """The EMA-on-the-CPU path with its staging buffers (pinned on a GPU machine; plain memory here) against
    the blocking copy: the same numbers. The GPU comparison is in tests/test_cuda.py."""
    from dit_core.train.ema import HostStaging, create_ema, update_ema

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    a, b = create_ema(model), create_ema(model)
    staging = HostStaging(list(model.parameters()))
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        update_ema(a, model, 0.9)
        update_ema(b, model, torch.tensor(0.9, dtype=torch.float64), staging)
        # the staging path copies through its buffers even when the devices agree (as it does from a GPU)
        staged, _ = staging.fetch([p.detach() for p in model.parameters()])
        assert all(torch.equal(s, p) for s, p in zip(staged, model.parameters()))
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-7)


def test_the_checkpoint_comparison_sees_a_difference_anywhere():
    a = {"model": {"w": torch.zeros(2)}, "rng": {"numpy": {"pos": 1, "keys": torch.arange(3)}}, "config": {"out": "a"}}
    b = {"model": {"w": torch.zeros(2)}, "rng": {"numpy": {"pos": 1, "keys": torch.arange(3)}}, "config": {"out": "b"}}
    assert_same_checkpoint(a, b)  # only the run folder differs: allowed
    b["rng"]["numpy"]["keys"] = torch.tensor([0, 1, 3])
    with pytest.raises(AssertionError, match="rng.numpy.keys differs"):
        assert_same_checkpoint(a, b)


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _rank_of(pid: int) -> int | None:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    ranks = [e.split(b"=", 1)[1] for e in env if e.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds torchrun's worker processes through /proc (Linux)")
def test_under_torchrun_a_signal_to_one_process_stops_both_at_the_same_step(tmp_path, digits_dir):
    """SIGTERM to rank 1 only: the processes agree at the next step boundary, rank 0 saves, nobody waits forever
    in the next gradient all-reduce."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "dit_core.train", "--data-path", str(digits_dir), *TINY_ARGS, "--batch-size", "16", "--max-steps", "2000",
           "--log-every", "1", "--ckpt-every", "100000", "--out", str(out)]
    proc = subprocess.Popen(cmd, env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_step(proc, 3)
    workers = {_rank_of(p): p for p in _children(proc.pid)}
    assert set(workers) >= {0, 1}, workers
    os.kill(workers[1], signal.SIGTERM)
    text, _ = proc.communicate(timeout=240)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "SIGTERM (on another process)", text  # rank 0 heard it from rank 1
    assert 3 <= summary["steps"] < 2000 and final_state(out)["step"] == summary["steps"]
    assert f"stopped by SIGTERM (on another process) after step {summary['steps']}" in text
