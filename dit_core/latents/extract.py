"""Pre-extraction: encode every image of an ImageFolder once with the VAE and store its posterior moments.

Running the VAE encoder inside the training loop costs as much as a large part of the DiT step, so fast-DiT
encodes the dataset once and trains on the stored latents. :func:`extract_latents` does that, with three
changes to the public recipe:

- **moments, not samples.** The encoder returns a Gaussian posterior (mean, std) per image. We store both,
  and :class:`~dit_core.latents.LatentDataset` draws ``mean + std * noise`` afresh at every access, as
  training through the VAE would. The public pre-extraction stores one draw per image and reuses it.
- **both flips.** The VAE is not mirror symmetric (the latent of a flipped image is not the flipped latent),
  so we encode the image and its mirror; the dataset picks one at random at each access.
- **a few large shards** (:mod:`.store`) instead of one small file per image.

Latents are stored already multiplied by the scale factor 0.18215 (``manifest["scaled"]`` is true). Extraction
is batched, shows a progress bar, and resumes after an interruption with a result identical to an
uninterrupted run (batches are aligned to fixed positions, so each image is encoded in the same batch).
A full disk stops it with a :class:`~dit_core.atomic.DiskFullError` that names the file, the space it needs and
how far the extraction got (each shard file is reserved in full when it is opened, so the disk cannot fill
in the middle of writing one).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from ..atomic import DiskFullError, disk_full_cause, free_bytes
from ..data.images import ImageFolderDataset
from ..runtime import DTYPES, resolve_device, resolve_precision, usable_cores
from ..vae import DEFAULT_VAE, downsample_factor, encode_moments, load_vae, vae_scale
from .store import FORMAT, FORMAT_VERSION, MANIFEST, SHARD_BYTES, STATE, STORAGE_DTYPES, LatentFormatError
from .store import end_pass, pass_bar, publish_manifest, save_npy, sha256_file, shard_names, write_json


class _ExtractionImages(torch.utils.data.Dataset):
    """The images in dataset order, unflipped; an undecodable file gives zeros and ``ok=False``."""

    def __init__(self, images: ImageFolderDataset):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        try:
            x, label = self.images.load(index)
            return x, label, True
        except Exception as err:  # noqa: BLE001 - any decode failure: skip this image, keep going
            warnings.warn(f"skipping unreadable image {self.images.samples[index][0]} ({err})", stacklevel=2)
            c = 3 if self.images.mode == "RGB" else 1
            size = self.images.image_size
            return torch.zeros(c, size, size), self.images.samples[index][1], False


def dataset_fingerprint(images: ImageFolderDataset) -> str:
    """sha256 over the class names and each file's relative path and size: changes when files are
    added, removed, renamed, relabelled or replaced by a file of another size."""
    h = hashlib.sha256()
    h.update(json.dumps(images.classes).encode())
    for path, label in images.samples:
        rel = os.path.relpath(path, images.root)
        try:
            size = os.path.getsize(path)
        except OSError:
            size = -1
        h.update(f"{rel}\t{label}\t{size}\n".encode())
    return h.hexdigest()


def extract_latents(
    dataset_root: str | os.PathLike,
    out_dir: str | os.PathLike,
    vae=DEFAULT_VAE,
    image_size: int = 256,
    batch_size: int = 32,
    precision: str | None = None,
    storage_dtype: str = "float16",
    device: str | torch.device | None = None,
    split: str | None = None,
    center_crop: str = "adm",
    num_workers: int | None = None,
    shard_size: int | None = None,
    resume: bool = True,
    overwrite: bool = False,
    max_batches: int | None = None,
    progress: bool = True,
    vae_name: str | None = None,
    dtype: torch.dtype | str | None = None,
) -> dict:
    """Encode every image of an ImageFolder dataset once and store its posterior moments.

    For each image (ADM center crop to ``image_size``) and its mirror image, the VAE posterior mean and
    std times 0.18215 go into ``mean-XXXXX.npy`` / ``std-XXXXX.npy`` shards of shape
    ``(n, 2, C, image_size/8, image_size/8)`` (axis 1: plain, flipped), in ``storage_dtype``. Labels go
    to ``labels.npy``; ``valid.npy`` marks images that could be decoded; ``manifest.json`` records the
    dataset fingerprint, VAE, sizes, scale, dtypes, classes and a sha256 per shard.

    ``vae``: a hub id, a local folder, or an already loaded ``AutoencoderKL`` (then pass ``vae_name`` to
    record where it came from). ``precision``: encoder autocast, "fp32" / "bf16" / "fp16" (default:
    :func:`dit_core.runtime.resolve_precision` for the VAE: fp16 on a GPU, fp32 on the CPU). ``resume``: continue an interrupted extraction in ``out_dir`` (the result
    is identical to an uninterrupted run); ``overwrite``: start again even if ``out_dir`` holds another
    extraction. ``max_batches``: stop after that many batches (to test resuming; the run is then
    incomplete). ``dtype``: the encoder precision given as a torch dtype (``torch.bfloat16``), an alias of
    ``precision``. Returns the manifest (complete) or the progress state (incomplete, ``"complete": False``).
    """
    out_dir = Path(out_dir)
    device = resolve_device(device)
    precision = resolve_precision(_precision_of(precision, dtype) or "auto", device, purpose="vae")
    if storage_dtype not in STORAGE_DTYPES:
        raise ValueError(f"storage_dtype must be one of {', '.join(STORAGE_DTYPES)}, got {storage_dtype!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")

    images = ImageFolderDataset(dataset_root, image_size, split=split, mode="RGB", flip=False, center_crop=center_crop)
    vae, vae_name = _ready_vae(vae, vae_name, device)
    config = _settings(dataset_root, images, vae, vae_name, image_size, split, center_crop, precision, storage_dtype,
                       batch_size, shard_size)
    state = _start_or_resume(out_dir, config, resume, overwrite)
    if state.get("complete"):
        return state
    batches = plan_batches(len(images), state["shard_size"], state["batch_size"], state["done"])[:max_batches]
    if num_workers is None:
        num_workers = min(8, max(0, usable_cores() - 1)) if len(batches) > 4 else 0
    t0 = time.perf_counter()
    _encode(out_dir, images, vae, batches, state, device, precision, num_workers, progress)
    return (end_pass(out_dir, state, len(images), t0)
            or _finish(out_dir, state, np.asarray(images.targets, dtype=np.int64)))


def _precision_of(precision: str | None, dtype) -> str | None:
    """``precision``, or the name of ``dtype`` (``torch.bfloat16`` or "bf16"), its alias; both must agree."""
    if dtype is None:
        return precision
    by_dtype = {v: k for k, v in DTYPES.items()}
    named = by_dtype.get(dtype, dtype if dtype in DTYPES else None)
    if named is None or (precision is not None and precision != named):
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)} or disagrees with precision")
    return named


def _ready_vae(vae, vae_name: str | None, device: torch.device):
    """``(vae, its name for the manifest)``: loaded from a hub id or folder, or a given model moved to ``device``."""
    if isinstance(vae, (str, os.PathLike)):
        return load_vae(vae, device=device), vae_name or str(vae)
    vae_name = vae_name or getattr(vae.config, "_name_or_path", None) or "custom"
    return vae.to(device).eval().requires_grad_(False), vae_name


def _settings(dataset_root, images: ImageFolderDataset, vae, vae_name: str, image_size: int, split, center_crop: str,
              precision: str, storage_dtype: str, batch_size: int, shard_size: int | None) -> dict:
    """What the manifest records of the extraction's settings (and a resumed one must agree on)."""
    factor = downsample_factor(vae)
    if image_size % factor:
        raise ValueError(f"image_size {image_size} must be a multiple of the VAE's downsampling factor {factor}")
    latent_shape = [int(vae.config.latent_channels), image_size // factor, image_size // factor]
    per_image = 2 * int(np.prod(latent_shape)) * np.dtype(storage_dtype).itemsize
    if shard_size is None:
        shard_size = max(1, SHARD_BYTES // per_image // batch_size) * batch_size
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dataset": {
            "root": str(Path(dataset_root).absolute()),
            "folder": str(images.root.absolute()),
            "split": split,
            "fingerprint": dataset_fingerprint(images),
        },
        "vae": vae_name,
        "image_size": image_size,
        "center_crop": center_crop,
        "latent_shape": latent_shape,
        "scale": vae_scale(vae),
        "scaled": True,
        "views": ["plain", "hflip"],
        "precision": precision,
        "storage_dtype": storage_dtype,
        "batch_size": batch_size,
        "shard_size": shard_size,
        "count": len(images),
        "classes": images.classes,
        "num_classes": images.num_classes,
    }


def plan_batches(count: int, shard_size: int, batch_size: int, done: int) -> list[list[int]]:
    """The image indices of every batch still to encode. Batches start at fixed positions (shard start + k *
    batch_size) and never cross a shard, so a resumed run encodes exactly the same batches as an uninterrupted
    one."""
    batches = []
    for shard in range((count + shard_size - 1) // shard_size):
        lo, hi = shard * shard_size, min(count, (shard + 1) * shard_size)
        for start in range(lo, hi, batch_size):
            if start + batch_size > done:
                batches.append(list(range(max(start, done), min(start + batch_size, hi))))
    return batches


def _encode(out_dir: Path, images: ImageFolderDataset, vae, batches: list, state: dict, device: torch.device,
            precision: str, num_workers: int, progress: bool) -> None:
    """Encode ``batches`` (each image and its mirror) into the shards, recording progress in ``state`` after
    every batch; an interruption or a full disk says how far it got and how to resume."""
    count, shard_size, latent_shape = state["count"], state["shard_size"], state["latent_shape"]
    storage_dtype, scale = state["storage_dtype"], state["scale"]
    loader = torch.utils.data.DataLoader(_ExtractionImages(images), batch_sampler=batches, num_workers=num_workers,
                                         pin_memory=device.type == "cuda", persistent_workers=False)
    bar = pass_bar(progress, count, state["done"], "extracting latents")
    open_shard = None  # (index, mean memmap, std memmap)
    try:
        for indices, (x, _, ok) in zip(batches, loader):
            shard = indices[0] // shard_size
            if open_shard is None or open_shard[0] != shard:
                rows = min(shard_size, count - shard * shard_size)
                open_shard = _open_partial(out_dir, shard, rows, latent_shape, storage_dtype)
            x = x.to(device, non_blocking=True)
            n = x.shape[0]
            mean, std = encode_moments(vae, torch.cat([x, x.flip(-1)]), precision, scale)
            # (2n, C, h, w) -> (n, 2, C, h, w): axis 1 holds the plain and the mirrored image
            mean = mean.view(2, n, *latent_shape).transpose(0, 1)
            std = std.view(2, n, *latent_shape).transpose(0, 1)
            lo = indices[0] - shard * shard_size
            open_shard[1][lo : lo + n] = mean.cpu().numpy().astype(storage_dtype)
            open_shard[2][lo : lo + n] = std.cpu().numpy().astype(storage_dtype)
            open_shard[1].flush()
            open_shard[2].flush()
            state["failed"] += [i for i, good in zip(indices, ok.tolist()) if not good]
            state["done"] = indices[-1] + 1
            if state["done"] == min(count, (shard + 1) * shard_size):
                open_shard = None  # close the memmaps before the rename
                state["shards"].append(_finish_shard(out_dir, shard))
            write_json(out_dir / STATE, state)
            if bar is not None:
                bar.update(n)
    except KeyboardInterrupt:
        print(f"\ninterrupted after {state['done']} of {count} images; run the same command again to resume")
        raise
    except DiskFullError as err:
        raise err.add(f"The {state['done']} of {count} images extracted so far are kept in {out_dir}; free space "
                      f"(or choose an --out folder on a larger disk) and run the same command again: it resumes "
                      f"at image {state['done']}.") from err.__cause__
    finally:
        if bar is not None:
            bar.close()


# Settings that must agree for a resumed extraction to continue the same one.
# The dataset is compared by content (fingerprint, split), so a dataset moved to another disk still resumes.
_MATCH_KEYS = ("format_version", "vae", "image_size", "center_crop", "latent_shape", "scale",
               "precision", "storage_dtype", "count", "classes")


def _differences(old: dict, new: dict) -> list[str]:
    diffs = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in _MATCH_KEYS if old.get(k) != new.get(k)]
    for k in ("fingerprint", "split"):
        if old.get("dataset", {}).get(k) != new["dataset"][k]:
            diffs.append(f"dataset {k}: {old.get('dataset', {}).get(k)!r} -> {new['dataset'][k]!r}")
    return diffs


def _start_or_resume(out_dir: Path, config: dict, resume: bool, overwrite: bool) -> dict:
    """Return the progress state: a fresh one, the interrupted one (resume), or the finished manifest."""
    manifest_path, state_path = out_dir / MANIFEST, out_dir / STATE
    for path in (manifest_path, state_path):
        if not path.is_file():
            continue
        old = json.loads(path.read_text())
        diffs = _differences(old, config)
        finished = path == manifest_path
        if not diffs and not overwrite and (finished or resume):
            if finished:
                return {**old, "complete": True}
            for key in ("batch_size", "shard_size"):
                if old[key] != config[key]:
                    warnings.warn(
                        f"resuming with {key}={old[key]} as the interrupted run used (not {config[key]})", stacklevel=3
                    )
            print(f"resuming: {old['done']} of {old['count']} images already extracted in {out_dir}")
            return old
        if diffs and not overwrite:
            what = "a finished extraction" if finished else "an interrupted extraction"
            raise LatentFormatError(
                f"{out_dir} holds {what} with other settings ({'; '.join(diffs)}); "
                "use another --out folder, or --overwrite to replace it"
            )
        _clear(out_dir)
        break
    if out_dir.exists() and any(p for p in out_dir.iterdir() if not p.name.startswith(".")):
        if not overwrite:
            raise LatentFormatError(f"{out_dir} is not empty and holds no extraction; choose an empty or new folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {**config, "done": 0, "failed": [], "shards": [], "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json(out_dir / STATE, state)
    return state


def _clear(out_dir: Path) -> None:
    """Remove the files of a previous extraction (only ours, nothing else)."""
    for p in out_dir.iterdir():
        ours = p.name in (MANIFEST, STATE, "labels.npy", "valid.npy") or p.name.startswith(("mean-", "std-"))
        if ours or (p.name.startswith(".") and ".tmp-" in p.name):
            if p.is_file():
                p.unlink()


def _open_partial(out_dir: Path, shard: int, rows: int, latent_shape, storage_dtype: str):
    """Open (or create) the memmaps a shard is written into; they carry a .partial suffix until complete."""
    arrays = []
    for name in shard_names(shard):
        path = out_dir / (name + ".partial")
        shape = (rows, 2, *latent_shape)
        if not path.exists() and (out_dir / name).exists():
            os.replace(out_dir / name, path)  # renamed just before a crash, but not yet recorded: reopen it
        if path.exists():
            arr = np.lib.format.open_memmap(path, mode="r+")
            if arr.shape != shape or arr.dtype != np.dtype(storage_dtype):
                raise LatentFormatError(
                    f"{path} has shape {arr.shape} {arr.dtype}, expected {shape} {storage_dtype}; use --overwrite"
                )
        else:
            arr = np.lib.format.open_memmap(path, mode="w+", dtype=storage_dtype, shape=shape)
        _reserve(path)
        arrays.append(arr)
    return (shard, *arrays)


def _reserve(path: Path) -> None:
    """Allocate the whole (sparse) shard file on disk now, so that a full disk is an error here, with the
    file's name and size, and not a crash (SIGBUS) when a memory-mapped page is written later."""
    if not hasattr(os, "posix_fallocate"):
        return
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if disk_full_cause(err) is None:
            return  # a file system without fallocate: the memmap works as before
        raise DiskFullError(path, size, free_bytes(path.parent)) from err
    finally:
        os.close(fd)


def _finish_shard(out_dir: Path, shard: int) -> dict:
    """Checksum a complete shard and rename it into place."""
    record = {"index": shard}
    for key, name in zip(("mean", "std"), shard_names(shard)):
        partial = out_dir / (name + ".partial")
        with open(partial, "rb+") as f:
            os.fsync(f.fileno())
        record[key] = name
        record[f"{key}_sha256"] = sha256_file(partial)
        os.replace(partial, out_dir / name)
    return record


def _finish(out_dir: Path, state: dict, labels: np.ndarray) -> dict:
    """Write labels, the validity mask and the manifest; remove the progress state."""
    valid = np.ones(state["count"], dtype=bool)
    valid[state["failed"]] = False
    save_npy(out_dir / "labels.npy", labels)
    save_npy(out_dir / "valid.npy", valid)
    manifest = {k: v for k, v in state.items() if k not in ("done", "failed")}
    manifest.update(
        labels="labels.npy",
        valid="valid.npy",
        num_valid=int(valid.sum()),
        skipped=[int(i) for i in state["failed"]],
        labels_sha256=sha256_file(out_dir / "labels.npy"),
        valid_sha256=sha256_file(out_dir / "valid.npy"),
    )
    return publish_manifest(out_dir, manifest)
