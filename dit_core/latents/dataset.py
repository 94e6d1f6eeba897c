"""Reading pre-extracted latents for training, and one function that opens latents or images alike.

Pixel-space profiles (the digits default) need no latents: :func:`open_dataset` returns an
:class:`~dit_core.data.ImageFolderDataset` for an image folder and a :class:`LatentDataset` for an
extraction folder, so the trainer calls one function for both.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..data.images import ImageFolderDataset
from .store import MANIFEST, STATE, read_manifest


class LatentDataset(torch.utils.data.Dataset):
    """Pre-extracted latents for training: ``dataset[i]`` is ``(z, label)``.

    ``z`` is a float32 tensor ``latent_shape`` (C, H/8, W/8), already scaled by 0.18215. With ``flip``, the
    plain or the mirrored image is picked at random at each access; with ``sample``, a fresh posterior
    draw ``mean + std * noise`` is returned (``sample=False`` returns the mean). Randomness comes from
    torch's generator, so DataLoader workers are seeded as usual. Images that failed to decode during
    extraction are left out.

    Attributes: ``classes``, ``num_classes``, ``latent_shape`` (= ``sample_shape``), ``scale``, ``vae``
    (the VAE id that decodes them), ``manifest``, ``targets``.
    """

    def __init__(self, path: str | os.PathLike, flip: bool = True, sample: bool = True):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.flip = flip
        self.sample = sample
        self.classes = list(self.manifest["classes"])
        self.latent_shape = tuple(self.manifest["latent_shape"])
        self.scale = float(self.manifest["scale"])
        self.vae = self.manifest["vae"]
        self.shard_size = int(self.manifest["shard_size"])
        labels = np.load(self.path / self.manifest["labels"])
        valid = np.load(self.path / self.manifest["valid"])
        self.indices = np.flatnonzero(valid)
        self.labels = labels
        self.targets = labels[self.indices].tolist()
        self._shards = None  # opened lazily, once per process (memmaps must not be pickled to workers)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.latent_shape

    def __len__(self) -> int:
        return len(self.indices)

    def _open(self):
        self._shards = [
            (np.load(self.path / rec["mean"], mmap_mode="r"), np.load(self.path / rec["std"], mmap_mode="r"))
            for rec in sorted(self.manifest["shards"], key=lambda r: r["index"])
        ]
        return self._shards

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_shards"] = None
        return state

    def moments(self, index: int, view: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored mean and std (float32) of image ``index`` for view 0 (plain) or 1 (mirrored)."""
        shards = self._shards or self._open()
        j = int(self.indices[index])
        mean, std = shards[j // self.shard_size]
        row = j % self.shard_size
        return torch.from_numpy(mean[row, view].astype(np.float32)), torch.from_numpy(std[row, view].astype(np.float32))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        view = int(torch.randint(2, ())) if self.flip else 0
        mean, std = self.moments(index, view)
        z = mean + std * torch.randn(mean.shape) if self.sample else mean
        return z, int(self.labels[self.indices[index]])

    def __repr__(self) -> str:
        return (
            f"LatentDataset(path={str(self.path)!r}, images={len(self)}, classes={self.num_classes}, "
            f"latent_shape={self.latent_shape}, vae={self.vae!r}, flip={self.flip}, sample={self.sample})"
        )


def open_dataset(
    path: str | os.PathLike,
    image_size: int | None = None,
    mode: str = "RGB",
    flip: bool = True,
    split: str | None = None,
    sample: bool = True,
    center_crop: str = "adm",
):
    """The training dataset behind ``path``: latents if it is an extraction folder, images otherwise.

    - a folder with ``manifest.json`` from :func:`extract_latents` -> :class:`LatentDataset` (latent-space
      DiT; sample with the VAE named in ``dataset.vae``);
    - an ImageFolder -> :class:`~dit_core.data.ImageFolderDataset` at ``image_size`` (pixel-space DiT, as
      the digits profile trains: no VAE at all), brought to a square by ``center_crop``.

    Both return ``(x, label)`` and have ``classes``, ``num_classes`` and ``sample_shape`` (C, H, W), so a
    trainer builds the model from ``sample_shape`` and never needs to know which one it got.
    """
    path = Path(path)
    if (path / MANIFEST).is_file() or (path / STATE).is_file():
        return LatentDataset(path, flip=flip, sample=sample)
    if image_size is None:
        raise ValueError(f"{path} is an image folder: pass image_size (the pixel size to train at)")
    return ImageFolderDataset(path, image_size, split=split, mode=mode, flip=flip, center_crop=center_crop)
