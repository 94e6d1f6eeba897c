"""Sample grids during training: a few images per class from the EMA model, at fixed seeds, every
``sample_every`` steps and at the end (:func:`sample_grid`), so that successive grids show the same noise
becoming better images."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ..runtime import resolve_precision
from .config import TrainConfig

_VAES: dict = {}
#: Latents decoded at a time for a grid: SD's VAE decoder holds 128 x 256 x 256 fp32 activations per 256 px image
#: (32 MB each, several alive at once), so 40 grid images in one decode would need several GB in the middle of
#: a run sized to fit the card; 8 at a time keep that to about 1 GB (an estimate from the shapes).
GRID_DECODE_BATCH = 8


def sample_grid(ema, diffusion, cfg: TrainConfig, out: Path, step: int, classes, is_latent: bool, dataset,
                device) -> Path | None:
    """A grid from the EMA model: one row per class (``sample_per_class`` each), fixed seeds, so grids of
    successive steps show the same noise becoming better digits/images. Returns the PNG path (None when the
    latents' VAE cannot be loaded here).

    The grid samples on the training device in the training precision, and leaves the EMA as it is: an EMA
    kept on the CPU (``ema_device: cpu``) is sampled through a temporary copy on the GPU (in bf16: 2 bytes a
    parameter, 1.35 GB for DiT-XL/2), freed afterwards (:func:`dit_core.sample.generate`); latents are decoded
    :data:`GRID_DECODE_BATCH` at a time. A model trained with ``class_dropout_prob:
    0`` has no null class, so its grids sample without guidance (cfg 1), with a note."""
    from ..data.images import present_labels
    from ..sample import generate, has_null_class, save_grid

    vae, scale = None, None
    if is_latent:
        base = dataset.dataset if isinstance(dataset, torch.utils.data.Subset) else dataset
        vae, scale = _vae(cfg.vae or getattr(base, "vae", None), device), getattr(base, "scale", None)
        if vae is None:
            return None
    num_classes = ema.num_classes
    if num_classes:
        shown = cfg.sample_classes if cfg.sample_classes is not None else present_labels(dataset)[:10]
        labels = [int(c) for c in shown for _ in range(cfg.sample_per_class)]
        names = [str(classes[c]) if c < len(classes) else str(c) for c in labels]
        nrow = cfg.sample_per_class
    else:
        labels, names, nrow = 16, None, 4
    cfg_scale = cfg.sample_cfg_scale if num_classes else 1.0
    if cfg_scale != 1.0 and not has_null_class(ema):
        warnings.warn(f"sample grids without guidance (cfg 1, not {cfg_scale}): class_dropout_prob 0 trains no null "
                      "class to guide with", stacklevel=2)
        cfg_scale = 1.0
    with torch.random.fork_rng(devices=[]):  # leave the training process's generators untouched
        images = generate(ema, diffusion, labels, cfg_scale=cfg_scale, sampler=cfg.sample_sampler,
                          steps=cfg.sample_steps, seed=cfg.seed, device=device, vae=vae, vae_scale=scale,
                          amp=resolve_precision(cfg.mixed_precision, device), decode_batch_size=GRID_DECODE_BATCH)
    path = out / "samples" / f"step_{step:07d}.png"
    save_grid(images, path, nrow=nrow, labels=names)
    return path


def _vae(name, device):
    """The VAE that decodes latent samples, loaded once; None (with a warning) when it is not available."""
    from ..vae import load_vae

    if name not in _VAES:
        try:
            _VAES[name] = load_vae(name, device=device)
        except (OSError, ValueError) as err:
            warnings.warn(f"sample grids skipped: the VAE {name!r} cannot be loaded ({err})", stacklevel=2)
            _VAES[name] = None
    return _VAES[name]
