"""VAE latents: pre-extract every image once, store the posterior moments in a few shards, read them fast.

DiT is a latent diffusion model: it denoises the 4 x H/8 x W/8 latents of Stable Diffusion's VAE
(:mod:`dit_core.vae`), not pixels (Peebles & Xie 2023, Sec. 3; Rombach et al. 2022).

- :mod:`.extract`: :func:`extract_latents` (``dit-extract-latents``): resumable, verified, both flips, moments;
- :mod:`.store`: the on-disk format (shards, labels, manifest) and :func:`verify`;
- :mod:`.dataset`: :class:`LatentDataset` (a fresh posterior draw and a random flip at every access) and
  :func:`open_dataset`, which opens an extraction folder or an image folder alike.
"""

from .dataset import LatentDataset, open_dataset
from .extract import dataset_fingerprint, extract_latents
from .store import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    SHARD_BYTES,
    STATE,
    STORAGE_DTYPES,
    LatentFormatError,
    read_manifest,
    sha256_file,
    verify,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST", "SHARD_BYTES", "STATE", "STORAGE_DTYPES", "LatentDataset",
           "LatentFormatError", "dataset_fingerprint", "extract_latents", "open_dataset", "read_manifest",
           "sha256_file", "verify"]
