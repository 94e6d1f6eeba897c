"""The embedded default dataset: scikit-learn's handwritten digits as an ImageFolder.

scikit-learn ships 1,797 grayscale 8x8 digits (UCI "optdigits", 16 grey levels, values 0..16) inside the
package, so every chapter can train a real class-conditional model with no download. :func:`export_digits`
writes them in the same layout as ImageNet (``out/train/<digit>/*.png`` and ``out/val/<digit>/*.png``),
so the code path from the digits to ImageNet is the same.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from ..atomic import replace_dir

MANIFEST = "digits.json"
FORMAT_VERSION = 1


def digits_split(labels: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
    """A stratified split: for each class, a seeded shuffle puts ``round(val_fraction * n)`` images in
    val. Returns a boolean mask, True for validation images."""
    rng = np.random.default_rng(seed)
    is_val = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        n_val = int(round(val_fraction * len(idx)))
        is_val[rng.permutation(idx)[:n_val]] = True
    return is_val


def export_digits(
    out_dir: str | os.PathLike,
    image_size: int | None = None,
    val_fraction: float = 0.2,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Export scikit-learn's digits as PNG files in an ImageFolder layout; returns ``out_dir``.

    - ``out_dir/train/<d>/<index>.png`` and ``out_dir/val/<d>/<index>.png`` for d in "0".."9", where
      ``index`` is the position in ``sklearn.datasets.load_digits()``, so every file can be traced back;
    - grey values 0..16 scaled to 0..255 (``round(v * 255 / 16)``), black background, white strokes;
    - ``image_size``: None keeps 8x8; a number upsamples with bicubic (smooth strokes);
    - idempotent: a folder already exported with the same parameters is left alone (its
      ``digits.json`` records them); other parameters raise unless ``overwrite=True``;
    - atomic: files are written in a temporary folder beside ``out_dir`` and renamed into place, so an
      interrupted export leaves nothing half-written, and two processes exporting at once agree.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size must be a positive number of pixels or None (8x8), got {image_size}")
    from sklearn.datasets import load_digits

    out_dir = Path(out_dir).absolute()
    params = {"image_size": image_size, "val_fraction": float(val_fraction), "seed": int(seed)}
    if _matches(out_dir, params):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (overwrite and (out_dir / MANIFEST).is_file()):
            hint = (
                "it was exported with other parameters; pass overwrite=True (--overwrite) to replace it"
                if (out_dir / MANIFEST).is_file()
                else "it holds other files; choose an empty or new folder"
            )
            raise FileExistsError(f"cannot export the digits to {str(out_dir)!r}: {hint}")

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)  # (1797, 8, 8)
    labels = digits.target.astype(int)
    is_val = digits_split(labels, val_fraction, seed)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        counts = {"train": {}, "val": {}}
        for i, (img, label, val) in enumerate(zip(images, labels, is_val)):
            split = "val" if val else "train"
            folder = tmp / split / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            pil = Image.fromarray(img)
            if image_size is not None and image_size != 8:
                pil = pil.resize((image_size, image_size), resample=Image.BICUBIC)
            pil.save(folder / f"{i:04d}.png")
            counts[split][str(label)] = counts[split].get(str(label), 0) + 1
        for split in ("train", "val"):  # every class folder exists, even with val_fraction=0
            for d in range(10):
                (tmp / split / str(d)).mkdir(parents=True, exist_ok=True)
        manifest = {
            "source": "sklearn.datasets.load_digits (UCI optdigits test set, 1797 images, 8x8, grey 0..16)",
            "format_version": FORMAT_VERSION,
            **params,
            "pixel_scale": "round(v * 255 / 16)",
            "counts": {s: dict(sorted(c.items(), key=lambda kv: int(kv[0]))) for s, c in counts.items()},
            "total": int(len(labels)),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        replace_dir(tmp, out_dir, lambda found: _matches(found, params))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _matches(out_dir: Path, params: dict) -> bool:
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("format_version") == FORMAT_VERSION and all(manifest.get(k) == v for k, v in params.items())
