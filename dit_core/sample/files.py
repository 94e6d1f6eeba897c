"""Samples to files and models from files: labelled PNG grids, the FID ``.npz``, and opening a checkpoint.

:func:`save_grid` writes a labelled PNG grid (:func:`make_grid` returns it for a notebook); :func:`save_npz` the
``.npz`` of the official FID tooling (``arr_0``: uint8 N x H x W x C) plus ``labels``, and
:func:`write_npz_stream` the same file from a stream of image chunks, without ever holding all of them (50,000
images of 256 px are 9.8 GB). :func:`load_model` opens anything ``dit-sample --ckpt`` accepts: a dit_core run or
checkpoint, an official ``.pt``, or a diffusers folder, and says what the file tells about sampling it.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from ..vae import OFFICIAL_VAE, SD_VAES
from .samplers import has_null_class


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``(N, C, H, W)`` in [-1, 1] to ``uint8`` ``(N, H, W, C)`` (the layout of PIL and of the FID tooling)."""
    x = ((images.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).numpy()


def save_npz(path: str | os.PathLike, images, labels=None) -> Path:
    """Write ``arr_0`` (uint8 N x H x W x C, the official FID tooling's format) and ``labels`` (int64, N).

    ``images``: ``(N, C, H, W)`` floats in [-1, 1] or an already converted uint8 ``(N, H, W, C)`` array.
    """
    arr = images if isinstance(images, np.ndarray) and images.dtype == np.uint8 else to_uint8(torch.as_tensor(images))
    if arr.ndim != 4:
        raise ValueError(f"images must be (N, H, W, C) uint8 or (N, C, H, W) floats, got shape {arr.shape}")
    data = {"arr_0": arr}
    if labels is not None:
        labels = np.asarray(torch.as_tensor(labels).cpu(), dtype=np.int64).reshape(-1)
        if len(labels) != len(arr):
            raise ValueError(f"{len(arr)} images but {len(labels)} labels")
        data["labels"] = labels
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **data)
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def _npy_header(shape, dtype) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()


def _zip_entry(name: str) -> zipfile.ZipInfo:
    # a fixed date (zip's earliest), so that the same arrays always give the same bytes (np.savez stamps the time)
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    return info


def write_npz_stream(f, chunks: Iterable[np.ndarray], shape, labels=None) -> int:
    """Write the FID ``.npz`` (``arr_0`` uint8 ``shape`` = N x H x W x C, optional ``labels``) to the open,
    seekable binary file ``f``, from ``chunks`` of images in order; returns the number of images written.

    The file is what :func:`save_npz` and ``np.savez`` write (an uncompressed zip of ``.npy`` entries, read by
    ``np.load``, ``dit-eval`` and the ADM evaluator), but ``arr_0`` is streamed into its zip entry one chunk at
    a time, so memory stays at one chunk whatever N is; its zip entries carry a fixed date, so the same images
    always give the same bytes.
    """
    shape = tuple(int(s) for s in shape)
    done = 0
    with zipfile.ZipFile(f, "w", allowZip64=True) as zf:
        with zf.open(_zip_entry("arr_0.npy"), "w", force_zip64=True) as entry:
            entry.write(_npy_header(shape, np.uint8))
            for chunk in chunks:
                chunk = np.ascontiguousarray(chunk)
                if chunk.dtype != np.uint8 or chunk.shape[1:] != shape[1:]:
                    raise ValueError(f"image chunk {chunk.dtype} {chunk.shape} does not fit uint8 {shape}")
                if done + len(chunk) > shape[0]:
                    raise ValueError(f"more than the {shape[0]} images announced")
                entry.write(chunk.data)
                done += len(chunk)
            if done != shape[0]:
                raise ValueError(f"{done} images written, {shape[0]} announced")
        if labels is not None:
            labels = np.ascontiguousarray(np.asarray(labels, dtype=np.int64).reshape(-1))
            if len(labels) != shape[0]:
                raise ValueError(f"{shape[0]} images but {len(labels)} labels")
            with zf.open(_zip_entry("labels.npy"), "w", force_zip64=True) as entry:
                entry.write(_npy_header(labels.shape, np.int64))
                entry.write(labels.data)
    return done


def save_grid(images: torch.Tensor, path: str | os.PathLike, nrow: int | None = None, labels=None,
              scale: int | None = None, pad: int = 2):
    """Save ``images`` (N, C, H, W) in [-1, 1] as one PNG grid, ``nrow`` images per row.

    Small images are enlarged (nearest neighbour) by ``scale`` (default: to at least 64 px), and each tile
    gets its label written above it when ``labels`` (numbers or names) are given. Returns the PIL image.
    """
    grid = make_grid(images, nrow=nrow, labels=labels, scale=scale, pad=pad)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
    return grid


def make_grid(images: torch.Tensor, nrow: int | None = None, labels=None, scale: int | None = None, pad: int = 2):
    """The labelled grid of :func:`save_grid` as a PIL image (for notebooks)."""
    from PIL import Image, ImageDraw

    arr = to_uint8(images)
    n, h, w, c = arr.shape
    nrow = nrow or max(1, math.ceil(math.sqrt(n)))
    scale = scale or max(1, math.ceil(64 / max(h, w)))
    th, tw = h * scale, w * scale
    band = 12 if labels is not None else 0
    rows = max(1, math.ceil(n / nrow))
    mode = "L" if c == 1 else "RGB"
    grid = Image.new(mode, (nrow * (tw + pad) + pad, rows * (th + band + pad) + pad), color=255)
    draw = ImageDraw.Draw(grid)
    for i in range(n):
        r, col = divmod(i, nrow)
        tile = Image.fromarray(arr[i, :, :, 0] if c == 1 else arr[i], mode)
        tile = tile.resize((tw, th), resample=Image.NEAREST)
        x0, y0 = pad + col * (tw + pad), pad + r * (th + band + pad)
        if labels is not None:
            draw.text((x0 + 1, y0), str(labels[i])[: max(1, tw // 6)], fill=0)
        grid.paste(tile, (x0, y0 + band))
    return grid


# ----------------------------------------------------------------------------------------------------------
# Opening a model
# ----------------------------------------------------------------------------------------------------------


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Open a model for sampling; returns ``(model, info)``.

    ``path``: a dit_core run folder (its ``checkpoints/last.pt``) or checkpoint, an official ``.pt`` (e.g.
    ``DiT-XL-2-256x256.pt``), a ``.safetensors`` state dict, or a diffusers ``DiTPipeline`` folder. ``info``
    holds what the file says about sampling it: ``kind`` ("dit_core", "official": a bare latent state dict or
    an official ``train.py`` checkpoint, "state_dict", "diffusers"), ``space`` ("pixel" or "latent"), ``vae`` (a
    name or folder, or None), ``label_names``, ``objective`` ("ddpm", or "flow": sample with the process of
    :func:`dit_core.diffusion.create_process`), ``noise_schedule``/``diffusion_steps``, ``null_class`` (whether
    guidance is possible), and the sampling settings (``sampler``, ``steps``, ``cfg_scale``, for an official
    checkpoint also ``guidance_channels``): the run's, or for an official checkpoint those of the official
    ``sample.py``. A run whose guidance was chosen after training (``<run>/guidance.json``,
    :mod:`dit_core.eval.guidance`) samples with that choice: ``cfg_scale``, ``guidance_interval`` and
    ``guidance_source`` come from there.
    """
    from ..checkpoint import load_dit
    from ..interop import is_diffusers_folder, load_diffusers

    path = Path(path)
    if path.is_dir() and (path / "checkpoints" / "last.pt").is_file():
        path = path / "checkpoints" / "last.pt"
    info: dict = {"path": str(path), "noise_schedule": "linear", "diffusion_steps": 1000, "objective": "ddpm"}
    if path.is_dir():
        if not is_diffusers_folder(path):
            raise FileNotFoundError(
                f"{path} is a folder but neither a dit_core run (no checkpoints/last.pt) nor a diffusers DiTPipeline "
                "folder (no model_index.json or transformer/config.json)"
            )
        model = load_diffusers(path, device=device, dtype=dtype)
        meta = model.checkpoint_meta
        info.update(kind="diffusers", label_names=meta.get("label_names"), vae=meta.get("vae"),
                    space=meta.get("space") or ("latent" if meta.get("vae") or model.in_channels == 4 else "pixel"))
        if info["space"] == "latent" and not info["vae"]:
            info["vae"] = OFFICIAL_VAE
        return model, info

    model = load_dit(path, device=device, dtype=dtype)
    config = _training_config(path)
    if config:
        latent = config.get("data_kind") == "latents" or bool(config.get("latents_path"))
        classes = config.get("classes")
        info.update(
            kind="dit_core", space="latent" if latent else "pixel", vae=config.get("vae") if latent else None,
            label_names=[str(c) for c in classes] if classes else None,
            noise_schedule=config.get("noise_schedule", "linear"), diffusion_steps=config.get("diffusion_steps", 1000),
            sampler=config.get("sample_sampler"), steps=config.get("sample_steps"),
            cfg_scale=config.get("sample_cfg_scale"), objective=config.get("objective", "ddpm"),
        )
        if latent and not info["vae"]:
            info["vae"] = _vae_of_latents(config.get("latents_path") or config.get("data_path"))
        info.update(chosen_guidance(path))
    else:  # a bare state dict or an official train.py checkpoint: the official models are latent models of SD's VAE
        latent = model.in_channels == 4
        vae = getattr(model, "checkpoint_meta", {}).get("vae")  # an official train.py checkpoint names its VAE
        # the official sample.py's settings: 250 DDPM steps, guidance 4.0 on 3 channels, the "mse" VAE by default
        info.update(kind="official" if latent else "state_dict", space="latent" if latent else "pixel",
                    vae=(SD_VAES.get(vae, OFFICIAL_VAE) if latent else None), label_names=None,
                    sampler="ddpm", steps=250, cfg_scale=4.0, guidance_channels=3 if latent else None)
    info["null_class"] = has_null_class(model)
    return model, info


#: The file in a run folder that holds the guidance chosen for the run (:mod:`dit_core.eval.guidance`).
GUIDANCE_FILE = "guidance.json"


def chosen_guidance(checkpoint: Path) -> dict:
    """The guidance chosen for the run that holds ``checkpoint`` (``<run>/checkpoints/*.pt``), as sampling
    settings ``cfg_scale``, ``guidance_interval`` and ``guidance_source`` (the file); {} when none was chosen."""
    import json

    checkpoint = Path(checkpoint)
    if checkpoint.parent.name != "checkpoints":
        return {}
    path = checkpoint.parent.parent / GUIDANCE_FILE
    try:
        chosen = json.loads(path.read_text())["chosen"]
        interval = chosen.get("interval")
        return {"cfg_scale": float(chosen["cfg_scale"]),
                "guidance_interval": [float(v) for v in interval] if interval else None,
                "guidance_source": str(path)}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _training_config(path: Path) -> dict:
    """The ``config`` a dit_core training checkpoint carries (read lazily through mmap), else {}."""
    if path.suffix not in (".pt", ".pth", ".ckpt"):
        return {}
    import argparse

    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - load_dit already accepted the file; old zip formats refuse mmap
        return {}
    config = ckpt.get("config") if isinstance(ckpt, dict) else None
    return dict(config) if isinstance(config, dict) else {}


def _vae_of_latents(folder) -> str | None:
    if not folder:
        return None
    manifest = Path(folder) / "manifest.json"
    if manifest.is_file():
        import json

        return json.loads(manifest.read_text()).get("vae")
    return None


def parse_classes(spec: str, num_classes: int | None = None) -> list[int]:
    """``"0-9,12"`` -> ``[0, 1, ..., 9, 12]``: comma-separated numbers and inclusive ranges, in that order."""
    out: list[int] = []
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else (part, "")
                lo, hi = int(lo), int(hi)
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f"cannot read class list {spec!r}: use numbers and ranges such as '0-9,12'") from None
    if not out:
        raise ValueError(f"class list {spec!r} names no class")
    if num_classes is not None:
        bad = [c for c in out if not 0 <= c < num_classes]
        if bad:
            raise ValueError(f"classes {bad[:10]} are out of range: this model has classes 0..{num_classes - 1}")
    return out
