"""FID-scale sampling: 50,000 images streamed to disk in shards, resumable, split across processes.

FID-50K (DiT Sec. 5) needs 50,000 samples: about 7 hours of one fast GPU at the paper's 250 guided steps, and
9.8 GB of uint8 pixels at 256 px (39 GB as float32). :func:`sample_to_npz` never holds more than one shard:

* **shards.** Sample ``i`` gets its label from a list fixed at the start (:func:`make_labels`) and its noise
  from ``seed + i`` (:func:`dit_core.sample.generate`), so shard ``k``, the samples ``[k S, (k+1) S)``, is a
  function of the settings and ``k`` only. Each shard is written atomically (:mod:`dit_core.atomic`) as
  ``shard_000123.npy`` (uint8 S x H x W x C) in the folder ``<out>.shards/`` as soon as it is sampled.
* **resume.** A rerun of the same command samples only the shards that are missing, so a killed run loses at
  most the shard it was sampling (one per process). The same settings run the same batches, so the finished
  ``.npz`` is bit-identical to that of an uninterrupted run. The settings are recorded in
  ``<out>.shards/manifest.json``; a rerun with other settings into the same ``--npz`` is refused, naming what
  differs, instead of mixing two sets of samples.
* **processes.** Under ``torchrun`` process ``r`` of ``W`` samples the missing shards ``r, r + W, ...`` of the
  list (disjoint sample indices, whatever ``W`` was in an earlier, interrupted run), and process 0 assembles.
* **assembly.** Process 0 streams the shards into the final ``.npz`` (:func:`dit_core.sample.files.write_npz_stream`:
  ``arr_0`` uint8 N x H x W x C and ``labels``, the format of the ADM evaluator and ``dit-eval``), written
  atomically, then deletes the shards; ``manifest.json`` stays and marks the run complete.

Labels (:func:`make_labels`): ``uniform`` draws every label independently and uniformly, as the official
``sample_ddp.py`` does (``torch.randint(0, num_classes, (n,))``); the DiT paper's FID of 2.27 and the 2.21 of
the official README come from that sampler, so ``uniform`` is what the book's FID figures use and what
``--official`` picks. ``balanced`` gives every class the same count (N/C each; when C does not divide N, a
seeded choice of N mod C classes get one more) in a seeded random order: less variance between two runs that
are compared with each other, but not the official protocol.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..atomic import atomic_write, atomic_write_text
from .files import write_npz_stream

LABEL_MODES = ("uniform", "balanced")
#: Settings recorded for information only: a resumed run may differ in them.
INFO_KEYS = ("ckpt", "device", "created", "complete", "npz_bytes", "shards_deleted")


class SampleRunError(RuntimeError):
    """A sampling run that cannot go on as asked (other settings in the folder, a full disk); the message says
    what happened and what to do."""


# ----------------------------------------------------------------------------------------------------------
# Labels, shards, the folder
# ----------------------------------------------------------------------------------------------------------


def make_labels(num_samples: int, num_classes: int, mode: str = "uniform", seed: int = 0,
                classes=None) -> np.ndarray:
    """``num_samples`` class labels (int64), a function of the arguments only.

    ``mode="uniform"``: independent uniform draws over ``classes`` (default all ``num_classes``), as the official
    ``sample_ddp.py``; ``"balanced"``: every class ``num_samples // C`` times (``num_samples % C`` seeded classes
    once more) in a seeded random order. An unconditional model (``num_classes`` 0) gets zeros.
    """
    num_samples = int(num_samples)
    if num_samples < 1:
        raise ValueError(f"the number of samples must be at least 1, got {num_samples}")
    if mode not in LABEL_MODES:
        raise ValueError(f"labels must be one of {', '.join(LABEL_MODES)}, got {mode!r}")
    if not num_classes:
        return np.zeros(num_samples, np.int64)
    pool = np.asarray(list(range(num_classes)) if classes is None else list(classes), dtype=np.int64)
    rng = np.random.default_rng([int(seed), 1])  # its own stream, apart from the per-sample noise seeds
    if mode == "uniform":
        return pool[rng.integers(0, len(pool), size=num_samples)]
    per_class, extra = divmod(num_samples, len(pool))
    counts = np.full(len(pool), per_class, dtype=np.int64)
    counts[rng.permutation(len(pool))[:extra]] += 1
    return rng.permutation(np.repeat(pool, counts))


def shard_bounds(num_samples: int, shard_size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the shards: ``shard_size`` samples each, the last one possibly shorter."""
    return [(a, min(a + shard_size, num_samples)) for a in range(0, num_samples, shard_size)]


def assigned_shards(todo: list[int], rank: int, world_size: int) -> list[int]:
    """The shards of ``todo`` that process ``rank`` of ``world_size`` samples: every ``world_size``-th one
    from position ``rank``. Every process computes ``todo`` from the same folder, so the parts are disjoint and
    together cover ``todo``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    return list(todo[rank::world_size])


def shard_folder(out: str | os.PathLike) -> Path:
    """Where the shards of ``out`` (``samples.npz``) go: ``samples.shards/`` beside it."""
    out = Path(out)
    return out.with_name(out.stem + ".shards")


def shard_path(folder: Path, k: int) -> Path:
    return folder / f"shard_{k:06d}.npy"


def fingerprint(path: str | os.PathLike) -> str:
    """A cheap identity of a checkpoint: sha256 over its size and first and last MiB (the end of a torch
    ``.pt`` file is its zip directory, which holds a CRC of every tensor); for a folder, over its files."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(path) if path.is_dir() else ''}:{size}".encode())  # a renamed file is the same
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            if size > 1 << 20:
                fh.seek(max(1 << 20, size - (1 << 20)))
                h.update(fh.read())
    return h.hexdigest()[:16]


def _read_manifest(folder: Path) -> dict | None:
    path = folder / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _differences(recorded: dict, settings: dict) -> list[str]:
    keys = sorted((set(recorded) | set(settings)) - set(INFO_KEYS))
    return [f"{k}: {recorded.get(k)!r} before, {settings.get(k)!r} now" for k in keys
            if recorded.get(k) != settings.get(k)]


def _disk_full(err: OSError) -> bool:
    return err.errno == errno.ENOSPC or type(err).__name__ == "DiskFullError"


def prepare(out: str | os.PathLike, settings: dict, labels: np.ndarray) -> dict:
    """Create ``<out>.shards/`` with the manifest and the labels, or check that the one there was written with
    the same settings. Returns the manifest. Run by process 0 only, before the others read the folder."""
    out = Path(out)
    folder = shard_folder(out)
    recorded = _read_manifest(folder)
    if recorded is None:
        if out.exists():
            raise SampleRunError(
                f"{out} already exists and was not written by a resumable run (no {folder}/manifest.json): "
                "delete it, or write to another --npz path"
            )
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / "labels.npy", lambda f: np.save(f, np.asarray(labels, np.int64)))
        manifest = dict(settings, created=time.strftime("%Y-%m-%d %H:%M:%S"), complete=False)
        atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=2) + "\n")
        return manifest
    check(out, settings)
    for stale in folder.glob(".shard_*.tmp-*"):  # what a killed writer left behind
        stale.unlink(missing_ok=True)
    return recorded


def check(out: str | os.PathLike, settings: dict) -> dict:
    """The manifest of ``out``'s run, after checking that it records the same ``settings``."""
    folder = shard_folder(out)
    recorded = _read_manifest(folder)
    if recorded is None:
        raise SampleRunError(f"{folder}/manifest.json is missing: was the folder deleted while sampling?")
    diffs = _differences(recorded, settings)
    if diffs:
        raise SampleRunError(
            f"{out} belongs to a sampling run with other settings ({folder}/manifest.json): "
            + "; ".join(diffs)
            + f". Rerun with the settings recorded there to resume it, or write to another --npz path (or delete "
            f"{out} and {folder} to start over)."
        )
    return recorded


# ----------------------------------------------------------------------------------------------------------
# Sampling and assembling
# ----------------------------------------------------------------------------------------------------------


def sample_to_npz(
    out: str | os.PathLike,
    sample_fn: Callable,
    settings: dict,
    labels: np.ndarray | None = None,
    *,
    shard_size: int,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] | None = None,
    progress: bool = True,
    keep_shards: bool = False,
) -> dict:
    """Sample ``settings["num_samples"]`` images into the ``.npz`` ``out``, shard by shard, resuming.

    ``sample_fn(labels, seed, tick)`` returns the uint8 images ``(n, H, W, C)`` of the samples with these labels
    whose first one is seeded ``seed`` (the next ``seed + 1``, ...), calling ``tick(images)`` as it goes (for
    the progress bar). ``settings`` are everything that decides the pixels (checkpoint fingerprint, sampler,
    steps, guidance, seed, batch size, ...): recorded on the first run, compared on every rerun. ``labels``
    (one per sample) are read from the folder on a rerun. ``barrier`` synchronises the processes of a
    ``torchrun`` (rank 0 prepares the folder before, and assembles after, the others' work).

    Returns a summary: ``sampled`` (images sampled by this process in this call), ``resumed`` (images found
    done), ``seconds``, ``npz`` (process 0), ``complete``.
    """
    out = Path(out)
    folder = shard_folder(out)
    barrier = barrier or (lambda: None)
    settings = json.loads(json.dumps(dict(settings, shard_size=int(shard_size))))  # as the manifest reads back
    n = int(settings["num_samples"])
    recorded = _read_manifest(folder)
    if recorded is not None:  # every process refuses other settings, before anyone waits for anyone
        check(out, settings)
        if recorded.get("complete") and out.is_file():
            return dict(sampled=0, resumed=n, seconds=0.0, npz=str(out), complete=True, already_complete=True)
    if rank == 0:
        if labels is None:
            raise ValueError("the first run needs the labels")
        prepare(out, settings, labels)
    barrier()
    check(out, settings)
    labels = np.load(folder / "labels.npy")
    if len(labels) != n:
        raise SampleRunError(f"{folder}/labels.npy holds {len(labels)} labels for {n} samples: delete {folder}")
    bounds = shard_bounds(n, int(shard_size))
    todo = [k for k in range(len(bounds)) if not shard_path(folder, k).is_file()]
    barrier()  # every process has listed the folder before any writes to it, so all see the same `todo`
    mine = assigned_shards(todo, rank, world_size)
    resumed = n - sum(b - a for a, b in (bounds[k] for k in todo))

    share = sum(bounds[k][1] - bounds[k][0] for k in mine)
    bar = _sampling_bar(out, share, world_size, resumed, n) if progress and rank == 0 else None
    start = time.perf_counter()
    sampled = _sample_shards(folder, mine, bounds, labels, int(settings["seed"]), sample_fn, bar)
    seconds = time.perf_counter() - start
    barrier()
    result = dict(sampled=sampled, resumed=resumed, seconds=seconds, complete=False, npz=None)
    if rank == 0:
        result.update(npz=str(assemble(out, keep_shards=keep_shards)), complete=True)
    return result


def _sampling_bar(out: Path, share: int, world_size: int, resumed: int, n: int):
    """The progress bar of this process's ``share`` of the images, in images (fractions while a batch runs)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=share, unit="img", desc=f"sampling {out.name}" + (f" (process 0 of {world_size})"
               if world_size > 1 else ""), bar_format="{l_bar}{bar}| {n:.0f}/{total} images "
               "[{elapsed}<{remaining}, {rate_fmt}]", smoothing=0.05)
    if resumed:
        bar.write(f"resuming {out}: {resumed} of {n} images were sampled before")
    return bar


def _sample_shards(folder: Path, mine: list, bounds, labels: np.ndarray, seed: int, sample_fn: Callable, bar) -> int:
    """Sample and write the shards ``mine`` (sample ``i`` seeded ``seed + i``); returns the images sampled.
    Closes ``bar``."""
    tick = bar.update if bar is not None else (lambda k: None)
    sampled = 0
    try:
        for k in mine:
            a, b = bounds[k]
            images = np.asarray(sample_fn(labels[a:b], seed + a, tick))
            if images.dtype != np.uint8 or images.ndim != 4 or len(images) != b - a:
                raise ValueError(f"sample_fn gave {images.dtype} {images.shape} for {b - a} samples; "
                                 "expected uint8 (n, H, W, C)")
            _write_shard(folder, k, images, bounds)
            if bar is not None:
                bar.n = round(bar.n)  # whole images at each shard's end, whatever the ticks added up to
                bar.refresh()
            sampled += b - a
    finally:
        if bar is not None:
            bar.close()
    return sampled


def _write_shard(folder: Path, k: int, images: np.ndarray, bounds) -> None:
    path = shard_path(folder, k)
    try:
        atomic_write(path, lambda f: np.save(f, images))
    except OSError as err:
        if not _disk_full(err):
            raise
        finished = len(list(folder.glob("shard_*.npy")))
        raise SampleRunError(
            f"the disk is full: writing shard {k} ({path}, {images.nbytes + 128:,} bytes for images "
            f"{bounds[k][0]}..{bounds[k][1] - 1}) failed ({err.strerror or err}). The {finished} shards finished "
            f"in {folder} are intact. Free some space (the final .npz needs about as much again as all the "
            "shards together) and rerun the same command: it resumes from the finished shards."
        ) from err


def assemble(out: str | os.PathLike, keep_shards: bool = False) -> Path:
    """Stream the finished shards of ``out``'s run into ``out`` (atomically), mark the run complete, and
    delete the shards (unless ``keep_shards``)."""
    out = Path(out)
    folder = shard_folder(out)
    manifest = _read_manifest(folder)
    labels = np.load(folder / "labels.npy")
    n = int(manifest["num_samples"])
    bounds = shard_bounds(n, int(manifest["shard_size"]))
    missing = [k for k in range(len(bounds)) if not shard_path(folder, k).is_file()]
    if missing:
        raise SampleRunError(f"cannot assemble {out}: shards {missing[:10]} are missing in {folder}; rerun the "
                             "same command to sample them")
    first = np.load(shard_path(folder, 0), mmap_mode="r")
    shape = (n, *first.shape[1:])
    del first

    def chunks():
        for k in range(len(bounds)):
            arr = np.load(shard_path(folder, k))
            if len(arr) != bounds[k][1] - bounds[k][0] or arr.shape[1:] != shape[1:]:
                raise SampleRunError(f"{shard_path(folder, k)} holds {arr.shape}, not the samples "
                                     f"{bounds[k][0]}..{bounds[k][1] - 1}: delete it and rerun the same command")
            yield arr

    try:
        atomic_write(out, lambda f: write_npz_stream(f, chunks(), shape, labels))
    except OSError as err:
        if not _disk_full(err):
            raise
        need = math.prod(shape) + 8 * n + 4096
        raise SampleRunError(
            f"the disk is full: writing {out} (about {need:,} bytes) failed ({err.strerror or err}). All "
            f"{len(bounds)} shards in {folder} are finished and intact: free some space and rerun the same "
            "command, which only assembles them."
        ) from err
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(out, 0o666 & ~umask)  # the permissions np.savez would give (the temporary file was private)
    if not keep_shards:
        for k in range(len(bounds)):
            shard_path(folder, k).unlink(missing_ok=True)
    manifest.update(complete=True, npz_bytes=out.stat().st_size, shards_deleted=not keep_shards)
    atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return out
