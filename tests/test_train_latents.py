"""The trainer on pre-extracted VAE latents (the GPU profiles' path), offline with a tiny AutoencoderKL: random
flips and posterior draws are a function of the item, so DataLoader workers do not change the run, and the
sample grids are decoded by the latents' own VAE."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

diffusers = pytest.importorskip("diffusers")

from dit_core import load_dit  # noqa: E402
from dit_core.latents import extract_latents  # noqa: E402
from dit_core.train import make_config, train  # noqa: E402

SIZE = 32  # pixels: latents 4 x 4 x 4


@pytest.fixture(scope="module")
def latents_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lat")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1, norm_num_groups=4,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16), sample_size=SIZE,
    )
    vae.save_pretrained(root / "tiny-vae")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / "images" / name).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)).save(root / "images" / name / f"{i}.png")
    out = root / "latents"
    result = extract_latents(root / "images", out, vae=str(root / "tiny-vae"), image_size=SIZE, batch_size=4,
                             num_workers=0, progress=False, precision="fp32")
    assert result["complete"]
    return out


def run(out, latents_dir, **kw):
    settings = dict(
        latents_path=str(latents_dir), image_size=SIZE, out=str(out), depth=2, hidden_size=32, num_heads=2,
        batch_size=4, grad_accum=2, grad_checkpointing=True, mixed_precision="fp32", max_steps=3, log_every=1,
        tensorboard=False, progress=False, sample_at_end=False, sample_per_class=1, sample_steps=3)
    return train(make_config("rtx3090-24gb", {**settings, **kw}))


def test_latent_training_does_not_depend_on_workers_and_decodes_samples(tmp_path, latents_dir):
    run(tmp_path / "w0", latents_dir, num_workers=0)
    summary = run(tmp_path / "w2", latents_dir, num_workers=2, sample_at_end=True)
    a = torch.load(tmp_path / "w0" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "w2" / "checkpoints" / "last.pt", weights_only=True)
    for name, value in a["model"].items():
        assert torch.equal(b["model"][name], value), name
    assert a["config"]["data_kind"] == "latents" and a["config"]["num_classes"] == 2
    model = load_dit(tmp_path / "w2" / "checkpoints" / "last.pt")
    assert (model.in_channels, model.input_size, model.num_classes, model.checkpointed_blocks) == (4, 4, 2, [])
    grid = Image.open(summary["samples"])  # decoded to 32 px RGB by the tiny VAE: 2 classes x 1 sample
    assert grid.mode == "RGB" and grid.size[1] > SIZE
