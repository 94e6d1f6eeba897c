"""Sample sets for evaluation: the ``.npz`` of the FID tooling, ``.npy`` arrays, folders of images.

A sample set is uint8 ``(N, H, W, C)`` images with C 1 or 3 (what :func:`dit_core.sample.save_npz` writes as
``arr_0``), optionally with their ``labels``; :func:`to_float_images` turns it into the ``(N, C, H, W)`` floats in
[-1, 1] that the models produce.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def load_images(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a sample set as ``(uint8 images (N, H, W, C), labels or None)``.

    Accepts the ``.npz`` of :func:`dit_core.sample.save_npz` / the official FID tooling (``arr_0``, optional
    ``labels``), an ``.npy`` array, or a folder of image files (read recursively, sorted by path).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"sample set not found: {path}")
    if path.is_dir():
        from PIL import Image

        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {path}")
        arrays = [np.asarray(Image.open(f).convert("RGB")) for f in files]
        if len({a.shape for a in arrays}) > 1:
            raise ValueError(f"images in {path} have different sizes; resize them to one size first")
        return np.stack(arrays), None
    if path.suffix == ".npy":
        return check_images(np.load(path), path), None
    if path.suffix == ".npz":
        with np.load(path) as data:
            if "arr_0" not in data:
                raise ValueError(f"{path} holds {sorted(data.files)}, not 'arr_0' images (or 'mu'/'sigma' statistics)")
            labels = np.asarray(data["labels"]) if "labels" in data else None
            return check_images(data["arr_0"], path), labels
    raise ValueError(f"cannot read {path}: use an .npz with arr_0, an .npy, or a folder of images")


def check_images(arr: np.ndarray, where) -> np.ndarray:
    """``arr`` as uint8 ``(N, H, W, C)`` images (a grey ``(N, H, W)`` set gets its channel axis), or a clear
    error naming ``where`` it came from."""
    if arr.ndim == 3:
        arr = arr[..., None]
    if arr.ndim != 4 or arr.shape[-1] not in (1, 3):
        raise ValueError(f"{where}: images must be uint8 (N, H, W, C) with C 1 or 3, got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"{where}: images must be uint8 in 0..255 (the FID tooling's format), got {arr.dtype}")
    return arr


def to_float_images(images) -> torch.Tensor:
    """uint8 ``(N, H, W, C)`` arrays become float ``(N, C, H, W)`` in [-1, 1]; float tensors pass through."""
    if isinstance(images, np.ndarray) and images.dtype == np.uint8:
        arr = check_images(images, "images")
        return torch.from_numpy(arr).permute(0, 3, 1, 2).float() / 127.5 - 1
    x = torch.as_tensor(images).float()
    if x.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W) floats or (N, H, W, C) uint8, got shape {tuple(x.shape)}")
    return x
