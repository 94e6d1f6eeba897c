"""Measuring the data pipeline: JPEG folders made offline, a VAE to time, and samples per second.

Chapter 2 (``book/02_latents.ipynb``) and ``benchmarks/data_bench.py`` share these helpers:

- :func:`make_jpegs` writes an ImageFolder of JPEGs at ImageNet-like sizes with no download, either smooth
  random colour fields or crops of the two photographs scikit-learn ships (``china.jpg``, ``flower.jpg``);
- :func:`demo_vae` loads a VAE by hub id or folder when its weights are here, and otherwise builds a randomly
  initialised ``AutoencoderKL`` of the same architecture, and says which one it returns. A VAE's speed,
  shapes and memory do not depend on its weights, so timings with random weights are real timings; its
  pictures are not (a random decoder paints noise);
- :func:`encoder_macs` counts the multiply-adds of one encoder pass, the cost pre-extraction removes from
  every training step;
- :func:`rate` and :func:`loader_rate` time a dataset item by item and through a ``DataLoader``.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image

#: A VAE with the real 8x downsampling (4 blocks) but 8-16 channels instead of 128-512: for smoke runs and
#: tests, where only shapes and code paths matter.
TINY_VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    layers_per_block=1,
    norm_num_groups=4,
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[8, 8, 16, 16],
    sample_size=256,
)

#: The photographs scikit-learn ships (427 x 640 JPEGs), used as offline sources of real image content.
PHOTOS = ("china.jpg", "flower.jpg")

JPEG_SOURCES = ("noise", "photos")


# --------------------------------------------------------------------------------------------- images
def make_jpegs(
    root: str | os.PathLike,
    n: int,
    classes: int = 10,
    seed: int = 0,
    source: str = "noise",
    quality: int = 90,
) -> int:
    """Write ``n`` JPEGs as an ImageFolder ``root/<class>/<index>.jpg``; returns their total size in bytes.

    Sizes are ImageNet-like (width 350-499, height 300-419 pixels), saved at JPEG ``quality``.

    - ``source="noise"``: smooth random colour fields with a little grain, in ``classes`` folders
      ``class000``, ``class001``, ...;
    - ``source="photos"``: random crops (40-100 % of each side, mirrored half of the time) of
      scikit-learn's two bundled photographs, one class per photograph (``china``, ``flower``; ``classes``
      is then at most 2). Real photographs decode at the same cost per pixel as ImageNet's.

    Images ``i`` go to class ``i % classes``; the same ``seed`` writes the same files.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1 image, got {n}")
    if classes < 1:
        raise ValueError(f"classes must be at least 1, got {classes}")
    if source not in JPEG_SOURCES:
        raise ValueError(f"source must be one of {', '.join(JPEG_SOURCES)}, got {source!r}")
    root = Path(root)
    rng = np.random.default_rng(seed)
    if source == "photos":
        from sklearn.datasets import load_sample_image

        photos = [(name.split(".")[0], Image.fromarray(load_sample_image(name))) for name in PHOTOS]
        photos = photos[: min(classes, len(photos))]
    total = 0
    for i in range(n):
        w, h = int(rng.integers(350, 500)), int(rng.integers(300, 420))
        if source == "photos":
            name, photo = photos[i % len(photos)]
            pw, ph = photo.size
            cw, ch = int(pw * rng.uniform(0.4, 1.0)), int(ph * rng.uniform(0.4, 1.0))
            left, top = int(rng.integers(0, pw - cw + 1)), int(rng.integers(0, ph - ch + 1))
            img = photo.crop((left, top, left + cw, top + ch)).resize((w, h), Image.BICUBIC)
            if rng.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            folder = root / name
        else:
            base = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
            img = Image.fromarray(base).resize((w, h), Image.BICUBIC)
            grain = rng.normal(0, 12, (h, w, 3))
            img = Image.fromarray(np.clip(np.asarray(img) + grain, 0, 255).astype(np.uint8))
            folder = root / f"class{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:06d}.jpg"
        img.save(path, quality=quality)
        total += path.stat().st_size
    return total


def folder_bytes(path: str | os.PathLike, pattern: str = "**/*") -> int:
    """Total size of the files below ``path`` that match ``pattern``."""
    return sum(p.stat().st_size for p in Path(path).glob(pattern) if p.is_file())


# --------------------------------------------------------------------------------------------- the VAE
def random_vae(architecture: str = "sd", seed: int = 0, device: str | torch.device = "cpu"):
    """A randomly initialised ``AutoencoderKL`` in eval mode: ``"sd"`` has Stable Diffusion's architecture
    (:data:`dit_core.bench.SD_VAE_CONFIG`, 83.7 M parameters), ``"tiny"`` the 8-16 channel one
    (:data:`TINY_VAE_CONFIG`). Same shapes and cost as a trained one; it reconstructs nothing."""
    from diffusers import AutoencoderKL

    from .bench import SD_VAE_CONFIG

    configs = {"sd": SD_VAE_CONFIG, "tiny": TINY_VAE_CONFIG}
    if architecture not in configs:
        raise ValueError(f"architecture must be 'sd' or 'tiny', got {architecture!r}")
    torch.manual_seed(seed)
    vae = AutoencoderKL(**configs[architecture])
    return vae.to(device).eval().requires_grad_(False)


def demo_vae(
    name: str | os.PathLike | None,
    device: str | torch.device = "cpu",
    download: bool = False,
    fallback: str = "sd",
) -> tuple[object, str, bool]:
    """``(vae, description, pretrained)``: the VAE ``name`` (hub id or folder) if it can be loaded, else a
    randomly initialised one of architecture ``fallback`` (see :func:`random_vae`).

    ``download=False`` never touches the network: a hub id must already be in the Hugging Face cache.
    When the named VAE cannot be loaded, the description gives the reason in one line and ``pretrained``
    is False, so a notebook can say that its pictures come from random weights.
    """
    from .latents import VAENotFoundError, load_vae

    if name:
        try:
            with warnings.catch_warnings():  # noise from huggingface_hub about an argument diffusers passes
                warnings.filterwarnings("ignore", message=".*local_dir_use_symlinks.*")
                vae = load_vae(name, device=device, local_files_only=not download)
            return vae, f"{name} (pretrained weights)", True
        except VAENotFoundError as err:
            reason = str(err).splitlines()[0]
            reason = reason if len(reason) <= 200 else reason[:197] + "..."
            description = (f"randomly initialised AutoencoderKL, {fallback!r} architecture: {name} could not "
                           f"be loaded ({reason})")
            return random_vae(fallback, device=device), description, False
    return random_vae(fallback, device=device), f"randomly initialised AutoencoderKL, {fallback!r} architecture", False


def encoder_macs(vae, image_size: int = 256) -> int:
    """Multiply-adds of one VAE encoder pass over one ``image_size`` image (counted by PyTorch's FLOP
    counter, halved). SD's VAE: about 136 G at 256 px, on top of the 356 G of one DiT-XL/2 training image
    (forward and backward), so encoding in the loop adds 38 % to the arithmetic of every step."""
    from torch.utils.flop_counter import FlopCounterMode

    p = next(vae.parameters())
    x = torch.zeros(1, int(vae.config.in_channels), image_size, image_size, device=p.device, dtype=p.dtype)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        vae.encode(x)
    return counter.get_total_flops() // 2


# --------------------------------------------------------------------------------------------- timing
def rate(fn, n: int, min_seconds: float = 1.0, max_seconds: float | None = None) -> float:
    """Calls per second of ``fn(i)`` (i = 0, 1, ...) over at least ``n`` calls and ``min_seconds``.

    One call before the clock starts warms up caches (memmaps opened, files in the page cache).
    ``max_seconds`` stops early once at least one timed call has run.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    fn(0)
    count, t0 = 0, time.perf_counter()
    while count < n or time.perf_counter() - t0 < min_seconds:
        fn(count)
        count += 1
        if max_seconds is not None and time.perf_counter() - t0 >= max_seconds:
            break
    return count / (time.perf_counter() - t0)


def loader_rate(dataset, batch_size: int, workers: int, batches: int) -> float:
    """Samples per second through a shuffling ``DataLoader``, timed after its first batch (worker start-up
    excluded), over ``batches`` batches (several epochs if the dataset is small)."""
    if batches < 1:
        raise ValueError(f"batches must be at least 1, got {batches}")
    batch_size = min(batch_size, len(dataset))
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                         drop_last=True, persistent_workers=workers > 0)
    seen, t0 = 0, None
    while seen < batches * batch_size:
        for x, _ in loader:
            if t0 is None:  # start the clock after the first batch
                t0 = time.perf_counter()
                continue
            seen += len(x)
            if seen >= batches * batch_size:
                break
    return seen / (time.perf_counter() - t0)
