"""Sample sets for evaluation: the ``.npz`` of the FID tooling, ``.npy`` arrays, folders of images.

A sample set is uint8 ``(N, H, W, C)`` images with C 1 or 3 (what :func:`dit_core.sample.save_npz` writes as
``arr_0``), optionally with their ``labels``; :func:`to_float_images` turns it into the ``(N, C, H, W)`` floats in
[-1, 1] that the models produce. :func:`iter_images` reads a set in chunks (from inside the ``.npz`` without
loading all of it: 50,000 images of 256 px are 9.8 GB), for statistics that never hold the whole set.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Iterator

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


def npz_image_shape(path: str | os.PathLike, key: str = "arr_0") -> tuple[int, ...] | None:
    """The shape of ``key`` in an ``.npz`` read from its header alone, or None when it has no such array."""
    with zipfile.ZipFile(path) as zf:
        if f"{key}.npy" not in zf.namelist():
            return None
        with zf.open(f"{key}.npy") as f:
            shape, _, _ = _read_header(f)
    return shape


def _read_header(f):
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


def iter_images(path: str | os.PathLike, chunk: int = 1000, limit: int | None = None) -> Iterator[np.ndarray]:
    """The images of a sample set, ``chunk`` at a time (uint8 ``(n, H, W, C)``), the first ``limit`` only
    when given. An ``.npz`` is read from inside its zip entry chunk by chunk (memory: one chunk), the way the
    ADM evaluator reads its batches; other formats are loaded whole by :func:`load_images` and cut up."""
    path = Path(path)
    if path.suffix == ".npz" and path.is_file():
        with zipfile.ZipFile(path) as zf:
            if "arr_0.npy" not in zf.namelist():
                raise ValueError(f"{path} holds {sorted(n[:-4] for n in zf.namelist())}, not 'arr_0' images")
            with zf.open("arr_0.npy") as f:
                shape, fortran, dtype = _read_header(f)
                if len(shape) == 3:
                    shape = (*shape, 1)
                check_images(np.zeros((0, *shape[1:]), dtype), path)  # the errors of a whole read
                if fortran:
                    raise ValueError(f"{path}: arr_0 is stored in Fortran order; save it C-ordered (np.savez does)")
                per_image = int(np.prod(shape[1:]))
                n = shape[0] if limit is None else min(shape[0], int(limit))
                for start in range(0, n, chunk):
                    k = min(chunk, n - start)
                    out = np.empty((k, *shape[1:]), np.uint8)
                    view, got = memoryview(out).cast("B"), 0
                    while got < len(view):
                        read = f.readinto(view[got:])
                        if not read:
                            raise ValueError(f"{path} is truncated: arr_0 ends inside image {start + got // per_image}")
                        got += read
                    yield out
        return
    images, _ = load_images(path)
    images = images if limit is None else images[:limit]
    for start in range(0, len(images), chunk):
        yield images[start : start + chunk]
