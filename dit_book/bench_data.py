"""Measuring the data pipeline: JPEG folders made offline, a VAE to time, and samples per second.

Chapter 2 (``book/02_latents.ipynb``) and ``benchmarks/data_bench.py`` share these helpers:

- :func:`make_jpegs` writes an ImageFolder of JPEGs at ImageNet-like sizes with no download, either smooth
  random colour fields or crops of the two photographs scikit-learn ships (``china.jpg``, ``flower.jpg``);
- :func:`encoder_macs` counts the multiply-adds of one encoder pass, the cost pre-extraction removes from
  every training step;
- :func:`rate` and :func:`loader_rate` time a dataset item by item and through a ``DataLoader``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

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
