"""The GPU track's helpers (dit_core.book.track) and what the trainer logs for it: data wait and memory."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from dit_core.book import track
from dit_core.train import make_config, train

TINY = dict(model="DiT-S/2", depth=1, hidden_size=32, num_heads=2, batch_size=8, num_workers=0, tensorboard=False,
            progress=False, sample_at_end=False, log_every=2, mixed_precision="fp32", device="cpu", flip=False,
            channels=1, image_size=8, preload="false")


class Items(torch.utils.data.Dataset):
    """16 random 1x8x8 images in 3 classes; each read sleeps ``delay`` seconds (a slow loader)."""

    num_classes, sample_shape, flip = 3, (1, 8, 8), False

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    def __len__(self):
        return 16

    def __getitem__(self, i):
        time.sleep(self.delay)
        return torch.randn(1, 8, 8, generator=torch.Generator().manual_seed(i)), i % 3


def test_the_log_shows_the_share_of_time_spent_waiting_for_data(tmp_path):
    shares = {}
    for name, delay in (("fast", 0.0), ("slow", 0.03)):
        train(make_config(None, {**TINY, "out": str(tmp_path / name), "max_steps": 4}), dataset=Items(delay))
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert len(records) == 2 and all(r["memory_gb"] > 0 and r["peak_memory_gb"] > 0 for r in records)
        shares[name] = records[-1]["data_wait_share"]
    # slow: 8 reads x 30 ms = 0.24 s of waiting per step, far more than a step of this tiny model
    assert shares["slow"] > 0.5 and shares["fast"] < shares["slow"]


def test_train_for_a_budget_resumes_the_same_run(tmp_path):
    calls = []

    def fake_train(cfg):  # the trainer's summary, with a fixed speed of 10 steps/s
        calls.append((cfg.max_steps, cfg.resume))
        return {"steps_this_run": 5, "train_seconds": 0.5}

    out = str(tmp_path / "run")
    result = track.train_for("digits", {"out": out}, minutes=0.05, calibration_steps=5, train_fn=fake_train)
    # a first leg of 5 steps, then 95 % of the 3 s left at 10 steps/s
    assert calls[0] == (5, "auto") and len(calls) == 2 and 20 <= calls[1][0] - 5 <= 29 and calls[1][1] == "auto"
    assert result["start_step"] == 0
    calls.clear()
    track.train_for("digits", {"out": out}, steps=7, train_fn=fake_train)
    assert calls == [(7, "auto")]
    # a real run: the step reached is read back from the checkpoint, and the next call continues from it
    over = {**TINY, "out": out}
    first = track.train_for("digits", over, steps=3, train_fn=lambda cfg: train(cfg, dataset=Items()))
    again = track.train_for("digits", over, steps=2, train_fn=lambda cfg: train(cfg, dataset=Items()))
    assert (first["start_step"], first["end_step"], again["start_step"], again["end_step"]) == (0, 3, 3, 5)


def test_cost_estimates_scale_with_the_cards_peak():
    assert track.card_peak("NVIDIA GeForce RTX 4090") == 165.2 and track.card_peak("NVIDIA H100 PCIe") == 756.0
    assert track.card_peak("NVIDIA H100 80GB HBM3") == 989.0 and track.card_peak("Some Other GPU") is None
    h200, rtx4090 = track.costs(989.0), track.costs(165.2)
    assert h200["05_training"] == rtx4090["05_training"] == 15 * 60  # a budget, not an estimate
    assert rtx4090["07_sampling"] == pytest.approx(h200["07_sampling"] * 989.0 / 165.2)
    # the anchor: DiT-XL/2 sampling on the H200 as measured, 250 guided DDPM steps per image
    assert track.sample_seconds("DiT-XL/2", 16, 250, 989.0, decode=False) == pytest.approx(8.49)
    assert track.train_images_per_s("DiT-XL/2", 989.0) == pytest.approx(195.9 * 4 / 3)
    assert "ESTIMATED" in track.format_costs(165.2, "RTX 4090")


def test_choose_track_and_standins(tmp_path, monkeypatch):
    paths = track.standins(tmp_path)
    mtimes = {k: p.stat().st_mtime_ns for k, p in paths.items()}
    assert track.standins(tmp_path) == paths and {k: p.stat().st_mtime_ns for k, p in paths.items()} == mtimes
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert track.choose_track("auto") == "cpu" and track.choose_track("GPU") == "gpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert track.choose_track("auto") == "gpu"
    with pytest.raises(ValueError, match="TRACK must be one of"):
        track.choose_track("tpu")


def test_sampled_and_real_images_for_fid(tmp_path):
    from dit_core.data.imagenette import LABELS, make_archive, prepare_imagenette
    from dit_core.models import DiT
    from dit_core.sample import generate, to_uint8

    torch.manual_seed(0)
    model = DiT(input_size=8, patch_size=4, in_channels=3, hidden_size=32, depth=1, num_heads=2, num_classes=10,
                learn_sigma=False)
    labels = [1, 2, 3, 4, 5]
    chunked, seconds = track.sample_uint8(model, None, labels, chunk=2, sampler="ddim", steps=3, seed=5)
    whole = to_uint8(generate(model, None, labels, sampler="ddim", steps=3, seed=5))
    assert chunked.dtype == np.uint8 and chunked.shape == (5, 8, 8, 3) and seconds > 0
    assert np.abs(chunked.astype(int) - whole.astype(int)).max() <= 1  # same seeds per image, chunks or not
    data = prepare_imagenette(tmp_path / "nette", archive=make_archive(tmp_path / "a.tgz", 1, 2, short_side=24),
                              checksum=False, progress=False)
    images, y = track.real_images(data, "val", 16, limit=5)
    assert images.shape == (5, 16, 16, 3) and images.dtype == np.uint8 and set(y) <= set(LABELS)
