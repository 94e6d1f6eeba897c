"""The training time budget (``max_minutes``, :mod:`dit_core.train.budget`): the length it decides, and that a
budgeted run is the run of that length, also when it is resumed on a machine of another speed."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import yaml

from dit_core.train import ConfigError, make_config, train
from dit_core.train import budget
from dit_core.train.budget import SETTLE, TimeBudget, decision_step, planned_steps

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
    """The budget reads its clock three times (start, first timed step, decision): 0, 1, 2 s by default."""
    clock = itertools.count(0.0, seconds_between_reads)
    monkeypatch.setattr(budget, "_clock", lambda: next(clock))


def test_a_budget_decides_once_and_a_decision_from_a_checkpoint_is_kept(monkeypatch):
    fake_clock(monkeypatch)
    b = TimeBudget(minutes=1.0, cap=10_000, warmup_steps=20)
    decided = [b.after_step(s) for s in range(1, 40)]
    # timed from step 3 to step 20: 1 s for 17 steps; 2 s spent; 20 + floor(58 * 17) = 1006
    assert decided[19] == 20 + int(58 * 17) and [d for d in decided if d is not None] == [1006]
    kept = TimeBudget(minutes=1.0, cap=10_000, warmup_steps=20, start_step=500, planned=1006)
    assert not kept.pending and all(kept.after_step(s) is None for s in range(501, 600))
    assert TimeBudget(minutes=0.0, cap=800, warmup_steps=20, planned=1006).planned is None  # budget off: max_steps
    assert TimeBudget(minutes=1.0, cap=800, warmup_steps=20, planned=1006).planned == 800  # a lower cap wins


def budgeted(out, **kw):
    """A tiny run whose warm-up (20 steps) outlasts the decision, with a cosine decay after it."""
    return make_config(None, {**TINY, "out": str(out), "warmup_steps": 20, "lr_schedule": "cosine",
                              "min_lr": 1e-4, "ckpt_every": 1000, **kw})


WEIGHTS = ("model", "ema", "opt", "step", "ema_updates", "data", "rng")


def test_a_budgeted_run_is_the_run_of_the_length_it_decided(tmp_path, monkeypatch):
    fake_clock(monkeypatch)
    minutes = 0.1  # 6 s: 20 + floor(4 s * 17 steps/s) = 88 steps
    summary = train(budgeted(tmp_path / "budget", max_minutes=minutes, max_steps=10_000), Blobs())
    assert summary["steps"] == 88
    recorded = yaml.safe_load((tmp_path / "budget" / "config.yaml").read_text())
    assert recorded["run"]["budget_steps"] == 88 and recorded["max_steps"] == 88
    train(budgeted(tmp_path / "fixed", max_steps=88), Blobs())  # the same run, configured with 88 steps
    a, b = final_state(tmp_path / "budget"), final_state(tmp_path / "fixed")
    assert a["config"]["budget_steps"] == 88
    for key in WEIGHTS:  # the weights, EMA, AdamW moments, data position and generator states
        assert_same_checkpoint(a[key], b[key], (key,))


def test_a_resumed_budgeted_run_keeps_its_length_on_a_machine_of_another_speed(tmp_path, monkeypatch):
    fake_clock(monkeypatch)
    train(budgeted(tmp_path / "whole", max_minutes=0.1, max_steps=10_000), Blobs())
    fake_clock(monkeypatch)
    train(budgeted(tmp_path / "first", max_minutes=0.1, max_steps=10_000, ckpt_every=40, keep_every=40), Blobs())
    part = tmp_path / "first" / "checkpoints" / "step_0000040.pt"
    fake_clock(monkeypatch, seconds_between_reads=10.0)  # 10x slower now: measuring again would stop at once
    summary = train(budgeted(tmp_path / "resumed", max_minutes=0.1, max_steps=10_000, resume=str(part)), Blobs())
    assert summary["steps"] == 88 and summary["steps_this_run"] == 48
    a, b = final_state(tmp_path / "whole"), final_state(tmp_path / "resumed")
    for key in WEIGHTS:
        assert_same_checkpoint(a[key], b[key], (key,))


def test_a_negative_or_nan_budget_is_refused():
    for bad in (-1, float("nan")):
        with pytest.raises(ConfigError, match="max_minutes"):
            make_config(None, {"max_minutes": bad})


def test_the_length_is_logged_and_checked_again_by_pre_flight(tmp_path, monkeypatch, capsys):
    fake_clock(monkeypatch)
    train(budgeted(tmp_path / "run", max_minutes=0.1, max_steps=10_000, sample_every=500), Blobs())
    out = capsys.readouterr().out
    before, _, after = out.partition("time budget 0.1 min:")
    assert "so 88 steps" in after.splitlines()[0]
    # the cap (10,000 steps) gave pre-flight nothing to say about the grids; the decided 88 steps do
    assert "sample_every" not in before and "sample_every 500 is longer than the run (88 steps)" in after
