"""The GPU track's helpers (dit_book.track) and what the trainer logs for it: data wait and memory."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dit_book import track
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
    assert h200["05b_your_data"] == rtx4090["05b_your_data"] == 15 * 60  # a budget, not an estimate
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


def test_the_cell_time_limit_is_the_books():
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "_config.yml").read_text())
    assert track.CELL_TIMEOUT_S == config["execute"]["timeout"]
    assert track.cell_budget() == pytest.approx(track.CELL_SHARE * track.CELL_TIMEOUT_S)
    assert 0 < track.cell_budget() < track.CELL_TIMEOUT_S


def test_fid_samples_are_sized_to_stay_within_the_cell_time_limit():
    budget = track.cell_budget()
    # chapter 07's FID cell at its 2,000 samples: past the limit on an RTX 3090 and a 3060, within it on a 4090
    per = {name: track.fid_seconds_per_sample(track.card_peak(name)) for name in ("RTX 3060", "RTX 3090", "RTX 4090")}
    assert 2000 * per["RTX 3060"] > 2000 * per["RTX 3090"] > track.CELL_TIMEOUT_S > 2000 * per["RTX 4090"]
    for name, seconds in per.items():
        n = track.fid_samples_within(track.card_peak(name))
        assert n % 10 == 0 and 10 <= n <= 2000 and n * seconds <= budget
        assert n == 2000 or (n + 10) * seconds > budget  # the largest that fits
    assert track.fid_samples_within(track.card_peak("RTX 4090")) == 2000
    n3060, n3090 = (track.fid_samples_within(track.card_peak(name)) for name in ("RTX 3060", "RTX 3090"))
    assert n3060 < n3090 < 2000
    assert track.fid_samples_within(None) == 2000 and track.fid_samples_within(25.5, 700) == 700  # a number: as given
    assert track.fid_samples_within(0.001) == 10  # at least one sample per class
    with pytest.raises(ValueError, match="FID_SAMPLES"):
        track.fid_samples_within(25.5, 0)
    # the cost estimate of chapter 07 follows the sized count
    assert track.costs(25.5)["07_sampling"] < track.costs(25.5, fid_samples=2000)["07_sampling"]


def test_latents_within_a_budget_stop_and_continue_where_they_stopped(tmp_path):
    """A fake clock: the first leg (4 batches) takes 10 s of a 30 s budget, so the second runs
    int(0.95 * 20 s * 0.4 batches/s) = 7 batches; the next call finishes, with the latents of one whole run."""
    from dit_core.data.imagenette import make_archive, prepare_imagenette
    from dit_core.vae import random_vae

    data = prepare_imagenette(tmp_path / "nette", archive=make_archive(tmp_path / "a.tgz", 3, 1, short_side=24),
                              checksum=False, progress=False)
    vae = random_vae("tiny", seed=0)
    kw = dict(image_size=16, batch_size=1, progress=False, device="cpu", num_workers=0)
    times = iter([0.0, 10.0])
    first = track.latents_within(data, tmp_path / "lat", vae, seconds=30, calibration_batches=4,
                                 clock=lambda: next(times), **kw)
    assert first["complete"] is False and first["done"] == 4 + 7 and first["count"] == 30
    second = track.latents_within(data, tmp_path / "lat", vae, seconds=30, calibration_batches=4, **kw)
    assert second["complete"] is True and second["count"] == 30
    whole = track.latents_within(data, tmp_path / "whole", vae, seconds=1e6, calibration_batches=100, **kw)
    assert whole["complete"] is True
    files = sorted(p.name for p in (tmp_path / "whole").glob("*.npy"))
    assert files and files == sorted(p.name for p in (tmp_path / "lat").glob("*.npy"))
    for name in files:
        assert np.array_equal(np.load(tmp_path / "lat" / name), np.load(tmp_path / "whole" / name)), name


def test_the_extraction_of_a_small_card_fits_two_cells():
    """Chapter 02 extracts in up to two cells of LATENTS_SHARE of the limit each (the rate measured as it runs):
    the estimate for all of Imagenette on the slowest card of the table fits, with room for the estimate's error."""
    slowest = min(peak for _, peak in track.GPU_PEAKS)
    need = track.encode_seconds(track.IMAGENETTE_IMAGES[0], slowest)
    assert need > track.cell_budget()  # one estimated cell would not do
    assert 1.25 * need < 2 * 0.95 * track.cell_budget(share=track.LATENTS_SHARE)
