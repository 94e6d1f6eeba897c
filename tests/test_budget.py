"""The training time budget (``max_minutes``, :mod:`dit_core.train.budget`): the length it decides, and that a
budgeted run is the run of that length, also when it is resumed on a machine of another speed."""

from __future__ import annotations

import itertools

import pytest
import yaml

from dit_core.train import ConfigError, make_config, train
from dit_core.train import budget
from dit_core.train.budget import SETTLE, TimeBudget, decision_step, planned_steps
from dit_core.train.step import TrainStep

from test_train import TINY, Blobs, assert_same_checkpoint, final_state


def test_the_length_is_what_fits_capped_and_never_below_the_steps_done():
    # 10 steps done in 5 s, 0.5 s a step, 1 minute: 10 + floor(55 / 0.5) = 120
    assert planned_steps(1.0, cap=10_000, done=10, spent_s=5.0, step_s=0.5) == 120
    assert planned_steps(1.0, cap=100, done=10, spent_s=5.0, step_s=0.5) == 100  # max_steps caps it
    assert planned_steps(0.05, cap=100, done=10, spent_s=5.0, step_s=0.5) == 10  # over budget: stop now
    assert planned_steps(1.0, cap=5, done=10, spent_s=5.0, step_s=0.5) == 10  # never below the steps done
    with pytest.raises(ValueError, match="positive"):
        planned_steps(1.0, cap=100, done=10, spent_s=5.0, step_s=0.0)


def test_the_decision_falls_inside_the_warmup_when_there_is_one():
    assert decision_step(1000) == SETTLE + 200  # at most 200 timed steps
    assert decision_step(100) == 100  # the warm-up's last step
    assert decision_step(20) == 20  # a short warm-up: decided as it ends
    assert decision_step(0) == SETTLE + 5  # no warm-up: after 5 timed steps


def fake_clock(monkeypatch, seconds_between_reads=1.0):
    """A clock that moves on by ``seconds_between_reads`` at every read (for TimeBudget alone)."""
    clock = itertools.count(0.0, seconds_between_reads)
    monkeypatch.setattr(budget, "_clock", lambda: next(clock))


def test_a_budget_decides_once_and_a_decision_from_a_checkpoint_is_kept(monkeypatch):
    fake_clock(monkeypatch)  # read at the start (0), at the first timed step (1) and at the decision (2)
    b = TimeBudget(minutes=1.0, cap=10_000, warmup_steps=20)
    decided = [b.after_step(s) for s in range(1, 40)]
    # timed from step 3 to step 20: 1 s for 17 steps; 2 s spent; 20 + floor(58 * 17) = 1006
    assert decided[19] == 20 + int(58 * 17) and [d for d in decided if d is not None] == [1006]
    kept = TimeBudget(minutes=1.0, cap=10_000, warmup_steps=20, start_step=500, planned=1006)
    assert not kept.pending and all(kept.after_step(s) is None for s in range(501, 600))
    assert not kept.spent()  # a resumed session trains on to the planned length
    assert TimeBudget(minutes=0.0, cap=800, warmup_steps=20, planned=1006).planned is None  # budget off: max_steps
    assert TimeBudget(minutes=1.0, cap=800, warmup_steps=20, planned=1006).planned == 800  # a lower cap wins


STEP = TrainStep.__call__


class StepClock:
    """Time that passes only in training steps: ``seconds[k]`` for step k (the last value from there on)."""

    def __init__(self, monkeypatch, seconds):
        self.now, self.steps, self.seconds = 0.0, 0, list(seconds)
        original = STEP  # not TrainStep.__call__: a StepClock made before in the same test replaced it

        def timed_step(stepper, step, micro_batches):
            self.now += self.seconds[min(self.steps, len(self.seconds) - 1)]
            self.steps += 1
            return original(stepper, step, micro_batches)

        monkeypatch.setattr(TrainStep, "__call__", timed_step)
        monkeypatch.setattr(budget, "_clock", lambda: self.now)


def budgeted(out, **kw):
    """A tiny run whose warm-up (20 steps) outlasts the decision, with a cosine decay after it."""
    return make_config(None, {**TINY, "out": str(out), "warmup_steps": 20, "lr_schedule": "cosine",
                              "min_lr": 1e-4, "ckpt_every": 1000, **kw})


WEIGHTS = ("model", "ema", "opt", "step", "ema_updates", "data", "rng")


def test_a_budgeted_run_is_the_run_of_the_length_it_decided(tmp_path, monkeypatch):
    StepClock(monkeypatch, [0.0625])  # 6 s at 1/16 s a step (exact in binary): 96 steps
    summary = train(budgeted(tmp_path / "budget", max_minutes=0.1, max_steps=10_000), Blobs())
    assert summary["steps"] == 96
    recorded = yaml.safe_load((tmp_path / "budget" / "config.yaml").read_text())
    assert recorded["run"]["budget_steps"] == 96 and recorded["max_steps"] == 96
    train(budgeted(tmp_path / "fixed", max_steps=96), Blobs())  # the same run, configured with 96 steps
    a, b = final_state(tmp_path / "budget"), final_state(tmp_path / "fixed")
    assert a["config"]["budget_steps"] == 96
    for key in WEIGHTS:  # the weights, EMA, AdamW moments, data position and generator states
        assert_same_checkpoint(a[key], b[key], (key,))


def test_a_resumed_budgeted_run_keeps_its_length_on_a_machine_of_another_speed(tmp_path, monkeypatch):
    StepClock(monkeypatch, [0.0625])
    train(budgeted(tmp_path / "whole", max_minutes=0.1, max_steps=10_000), Blobs())
    StepClock(monkeypatch, [0.0625])
    train(budgeted(tmp_path / "first", max_minutes=0.1, max_steps=10_000, ckpt_every=40, keep_every=40), Blobs())
    part = tmp_path / "first" / "checkpoints" / "step_0000040.pt"
    StepClock(monkeypatch, [1.0])  # 16x slower now: measuring again, or a deadline, would stop it at once
    summary = train(budgeted(tmp_path / "resumed", max_minutes=0.1, max_steps=10_000, resume=str(part)), Blobs())
    assert summary["steps"] == 96 and summary["steps_this_run"] == 56
    a, b = final_state(tmp_path / "whole"), final_state(tmp_path / "resumed")
    for key in WEIGHTS:
        assert_same_checkpoint(a[key], b[key], (key,))


def test_a_negative_or_nan_budget_is_refused():
    for bad in (-1, float("nan")):
        with pytest.raises(ConfigError, match="max_minutes"):
            make_config(None, {"max_minutes": bad})


def test_the_length_is_logged_and_checked_again_by_pre_flight(tmp_path, monkeypatch, capsys):
    StepClock(monkeypatch, [0.0625])
    train(budgeted(tmp_path / "run", max_minutes=0.1, max_steps=10_000, sample_every=500, reference_steps=400),
          Blobs())
    out = capsys.readouterr().out
    before, _, after = out.partition("time budget 0.1 min:")
    assert "(steps 4-20), so 96 steps" in after.splitlines()[0]
    # the cap (10,000 steps) gave pre-flight nothing to say about the grids; the decided 96 steps do
    assert "sample_every" not in before and "sample_every 500 is longer than the run (96 steps)" in after
    # nor about the profile's reference length: 96 of 400 steps, and the minutes that 400 would take here
    assert "reference_steps" not in before
    assert "fits only 96 steps on this machine, 24 % of the 400" in after and "fix: --max-minutes 1 " in after


def test_a_run_that_becomes_slower_ends_when_its_minutes_are_spent_and_resumes_to_its_length(tmp_path, monkeypatch,
                                                                                               capsys):
    # measured at 1/16 s a step (96 steps planned), then from step 30 on 1/8 s a step: the 6 s are spent after
    # 30 / 16 + 33 / 8 s, at step 63 (the deadline is looked at every 10 steps: step 70)
    StepClock(monkeypatch, [0.0625] * 30 + [0.125])
    summary = train(budgeted(tmp_path / "run", max_minutes=0.1, max_steps=10_000, sample_every=0), Blobs())
    assert summary["steps"] == 70 and not summary["interrupted"]
    assert "time budget 0.1 min spent at step 70 of 96" in capsys.readouterr().out
    state = final_state(tmp_path / "run")
    assert state["step"] == 70 and state["config"]["budget_steps"] == 96
    StepClock(monkeypatch, [0.125])
    summary = train(budgeted(tmp_path / "run", max_minutes=0.1, max_steps=10_000, resume=True), Blobs())
    assert summary["steps"] == 96 and summary["steps_this_run"] == 26
