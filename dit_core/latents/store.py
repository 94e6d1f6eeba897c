"""The on-disk format of pre-extracted latents: a few large shards, a manifest, and a check of both.

An extraction folder holds ``mean-XXXXX.npy`` / ``std-XXXXX.npy`` shards of shape ``(n, 2, C, H/8, W/8)``
(axis 1: the plain and the mirrored image) of about 1 GiB each, ``labels.npy``, ``valid.npy`` (images that
could be decoded) and ``manifest.json`` with the dataset fingerprint, the VAE, sizes, the scale, dtypes, the
classes and a sha256 per file; ``state.json`` exists while an extraction is in progress. Every file is written
atomically. :func:`verify` re-checks shapes, checksums and values.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from ..atomic import atomic_write, atomic_write_text

FORMAT = "dit-latents"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATE = "state.json"  # exists while an extraction is in progress
STORAGE_DTYPES = ("float16", "float32")
SHARD_BYTES = 1 << 30  # aim for about 1 GiB per shard file


class LatentFormatError(ValueError):
    """An extraction folder is missing, incomplete, or does not match the requested settings."""


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def save_npy(path: Path, arr: np.ndarray) -> None:
    atomic_write(path, lambda f: np.save(f, arr))


def sha256_file(path: str | os.PathLike, chunk: int = 16 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def pass_bar(progress: bool, count: int, done: int, desc: str):
    """The progress bar of an extraction pass (None without ``progress``); close it when the pass ends."""
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=count, initial=done, unit="img", desc=desc, dynamic_ncols=True)


def end_pass(out_dir: Path, state: dict, count: int, started: float) -> dict | None:
    """After an extraction pass (latents or teacher features) begun at ``time.perf_counter()`` ``started``: its
    time is added to ``state``; a pass that stopped early saves ``state`` (the next one resumes there) and
    returns it marked incomplete; a finished one returns None (the caller writes the manifest)."""
    state["seconds"] = state.get("seconds", 0.0) + time.perf_counter() - started
    if state["done"] < count:
        write_json(out_dir / STATE, state)
        return {**state, "complete": False}
    return None


def publish_manifest(out_dir: Path, manifest: dict) -> dict:
    """Write the finished extraction's manifest, remove its progress state; returns it marked complete."""
    manifest["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json(out_dir / MANIFEST, manifest)
    (out_dir / STATE).unlink(missing_ok=True)
    return {**manifest, "complete": True}


def shard_names(index: int) -> tuple[str, str]:
    return f"mean-{index:05d}.npy", f"std-{index:05d}.npy"


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a finished extraction; a clear error for a missing or unfinished one."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        manifest = json.loads((path / MANIFEST).read_text())
        if manifest.get("format") != FORMAT:
            raise LatentFormatError(
                f"{path / MANIFEST} is not a latent extraction manifest (format {manifest.get('format')!r})"
            )
        return manifest
    if (path / STATE).is_file():
        state = json.loads((path / STATE).read_text())
        raise LatentFormatError(
            f"the extraction in {path} is unfinished ({state.get('done')} of {state.get('count')} images); "
            "run the same dit-extract-latents command again to resume it"
        )
    raise LatentFormatError(
        f"no latents in {str(path)!r} (no {MANIFEST}); create them with "
        f"`dit-extract-latents --data-path DATA --out {path}`, or train in pixel space on an image folder"
    )


def _file_problem(path: Path, sha256: str, checksums: bool) -> str | None:
    """Why a file the manifest records cannot be trusted (missing, or changed since it was written), or None."""
    if not path.is_file():
        return f"{path.name} is missing"
    if checksums and sha256_file(path) != sha256:
        return f"{path.name}: checksum mismatch (corrupted or modified after extraction)"
    return None


def _checked_array(path: Path, sha256: str, checksums: bool, problems: list, mmap_mode=None):
    """The array a manifest records in ``path``, or None with the reason added to ``problems`` (missing,
    changed since it was written, unreadable)."""
    problem = _file_problem(path, sha256, checksums)
    if problem is None:
        try:
            return np.load(path, mmap_mode=mmap_mode)
        except (ValueError, OSError) as err:
            problem = f"{path.name}: unreadable ({err})"
    problems.append(problem)
    return None


def verify(out_dir: str | os.PathLike, checksums: bool = True, values: bool = True, chunk: int = 4096) -> list[str]:
    """Check a finished extraction; returns the problems found (an empty list means it is sound).

    Checks the manifest, that every shard exists with the recorded shape and dtype, its sha256 against
    the manifest (``checksums``), labels and validity mask, and that every stored mean is finite and
    every std finite and non-negative (``values``, read in chunks of ``chunk`` images).
    """
    out_dir = Path(out_dir)
    try:
        m = read_manifest(out_dir)
    except (LatentFormatError, ValueError) as err:
        return [str(err)]
    problems = []
    count, shard_size, shape = m["count"], m["shard_size"], tuple(m["latent_shape"])
    expected_shards = (count + shard_size - 1) // shard_size
    if len(m["shards"]) != expected_shards:
        problems.append(f"manifest lists {len(m['shards'])} shards, {expected_shards} expected for {count} images")
    for key in ("labels", "valid"):
        arr = _checked_array(out_dir / m[key], m[f"{key}_sha256"], checksums, problems)
        if arr is None:
            continue
        if arr.shape != (count,):
            problems.append(f"{m[key]}: shape {arr.shape}, expected ({count},)")
        elif key == "labels" and count and (arr.min() < 0 or arr.max() >= m["num_classes"]):
            problems.append(f"labels.npy: labels outside 0..{m['num_classes'] - 1}")
        elif key == "valid" and int(arr.sum()) != m["num_valid"]:
            problems.append(f"valid.npy: {int(arr.sum())} valid images, manifest says {m['num_valid']}")
    for rec in m["shards"]:
        rows = min(shard_size, count - rec["index"] * shard_size)
        for key in ("mean", "std"):
            arr = _checked_array(out_dir / rec[key], rec[f"{key}_sha256"], checksums, problems, mmap_mode="r")
            if arr is None:
                continue
            if arr.shape != (rows, 2, *shape) or arr.dtype != np.dtype(m["storage_dtype"]):
                expected = f"{(rows, 2, *shape)} {m['storage_dtype']}"
                problems.append(f"{rec[key]}: shape {arr.shape} {arr.dtype}, expected {expected}")
                continue
            if values:
                for lo in range(0, rows, chunk):
                    block = np.asarray(arr[lo : lo + chunk], dtype=np.float32)
                    if not np.isfinite(block).all():
                        problems.append(f"{rec[key]}: non-finite values near image {rec['index'] * shard_size + lo}")
                        break
                    if key == "std" and (block < 0).any():
                        problems.append(f"{rec[key]}: negative std near image {rec['index'] * shard_size + lo}")
                        break
    return problems
