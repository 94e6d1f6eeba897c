"""Imagenette: ten ImageNet classes, about 13,000 photographs, the GPU track's real dataset.

Imagenette (fast.ai; https://github.com/fastai/imagenette) is a subset of ImageNet: 10 easily told apart classes,
9,469 training and 3,925 validation images (the "v2" 70/30 split), in a 320 px release whose shortest side is
resized to 320 pixels. Its archive ``imagenette2-320.tgz`` (341,663,724 bytes) holds::

    imagenette2-320/train/<wnid>/<wnid>_<n>.JPEG
    imagenette2-320/val/<wnid>/ILSVRC2012_val_<n>.JPEG
    imagenette2-320/noisy_imagenette.csv

:func:`prepare_imagenette` (``dit-data imagenette OUT``) gets the archive (:func:`dit_core.downloads.imagenette_archive`:
a local file, the cache, or a download when asked), streams it through :mod:`tarfile` and writes an ImageFolder
``OUT/{train,val}/<wnid>/`` with a label map (:data:`dit_core.data.images.LABEL_MAP`) that gives each class its
**ImageNet-1k index** out of 1000 (tench is 0, parachute 701). Labels then mean the same classes as in the
official DiT checkpoints, which were trained on ImageNet with the classes numbered by sorted wnid.

The folder appears only when it is complete: files go into a hidden staging folder beside it (a killed run
continues there, skipping the files it already wrote), and the staging folder is renamed into place after the
counts are checked and ``imagenette.json`` is written. :func:`make_archive` writes a small archive in the same
layout from generated JPEGs, for tests and for measuring the GPU track without a download.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_text
from .images import IMG_EXTENSIONS, LabelMap, write_label_map

#: (wnid, name, ImageNet-1k index) of the ten classes. Indices follow the standard sorted-wnid order of ImageNet-1k
#: (checked against the usual ``imagenet_class_index.json``; /work/notes/facts.md, section 1.5).
CLASSES = (
    ("n01440764", "tench", 0),
    ("n02102040", "English springer", 217),
    ("n02979186", "cassette player", 482),
    ("n03000684", "chain saw", 491),
    ("n03028079", "church", 497),
    ("n03394916", "French horn", 566),
    ("n03417042", "garbage truck", 569),
    ("n03425413", "gas pump", 571),
    ("n03445777", "golf ball", 574),
    ("n03888257", "parachute", 701),
)
#: ImageNet-1k indices of the ten classes, in the order above.
LABELS = [index for _, _, index in CLASSES]
#: Readable name by ImageNet-1k index.
NAMES = {index: name for _, name, index in CLASSES}
#: The archive's top folder and its image counts (Hugging Face ``frgfm/imagenette`` dataset_infos.json).
ARCHIVE_ROOT = "imagenette2-320"
COUNTS = {"train": 9469, "val": 3925}
SPLITS = ("train", "val")
NOISY_CSV = "noisy_imagenette.csv"
#: Written last into a prepared folder: what it holds and where it came from.
MARKER = "imagenette.json"


def label_map() -> LabelMap:
    """The ten wnids with their ImageNet-1k indices, out of 1000 classes."""
    return LabelMap(num_classes=1000, index={w: i for w, _, i in CLASSES}, names={w: n for w, n, _ in CLASSES})


def is_prepared(out: str | os.PathLike) -> bool:
    """True when ``out`` holds a complete prepared Imagenette (its marker file exists)."""
    return (Path(out) / MARKER).is_file()


def _staging(out: Path) -> Path:
    return out.parent / f".{out.name}.partial"


def _member_target(name: str) -> tuple[str, ...] | None:
    """Where an archive member goes, relative to the output folder, or None to skip it.

    Accepted: ``<top>/<split>/<wnid>/<image>`` with a known split and wnid, and ``<top>/noisy_imagenette.csv``,
    each also with a leading ``./`` (as ``tar -C dir -czf archive.tgz .`` writes them). Anything else (other
    folders, absolute paths, ``..``) is skipped, so a hostile archive writes nothing outside the output folder.
    """
    name = name.replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    if len(parts) == 2 and parts[1] == NOISY_CSV:
        return (NOISY_CSV,)
    wnids = {w for w, _, _ in CLASSES}
    if len(parts) == 4 and parts[1] in SPLITS and parts[2] in wnids and parts[3].lower().endswith(IMG_EXTENSIONS):
        return tuple(parts[1:])
    return None


def prepare_imagenette(  # the archive's keywords are dit_core.downloads.imagenette_archive's, spelled out
    out: str | os.PathLike,
    archive: str | os.PathLike | None = None,
    download: bool = False,
    cache: str | os.PathLike | None = None,
    url: str | None = None,
    checksum: bool = True,
    progress: bool = True,
) -> Path:
    """Write Imagenette as an ImageFolder with ImageNet-1k labels into ``out``; returns ``out``.

    ``archive``: a local ``imagenette2-320.tgz`` (else the cache, else a download when ``download`` is true; see
    :func:`dit_core.downloads.imagenette_archive`, which also takes ``cache`` and ``url``). ``checksum``: check
    the archive's size and sha256 against the published ones (switch it off only for an archive you made
    yourself, e.g. with :func:`make_archive`). An ``out`` that is already prepared is returned as it is.
    """
    from ..downloads import imagenette_archive

    out = Path(out).expanduser()
    if is_prepared(out):
        return out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"{out} exists and is not a prepared Imagenette folder (no {MARKER}); choose a new folder or empty it"
        )
    path = imagenette_archive(archive=archive, download=download, cache=cache, url=url, checksum=checksum,
                              progress=progress)
    staging = _staging(out)
    staging.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    counts = _unpack(path, staging, progress, total=sum(COUNTS.values()) if checksum else None)
    totals = _check_counts(path, counts, checksum)
    write_label_map(staging, label_map())
    manifest = {
        "dataset": "imagenette2-320",
        "source": "https://github.com/fastai/imagenette",
        "archive": {"path": str(path), "size": path.stat().st_size, "checksum_verified": bool(checksum)},
        "counts": totals,
        "per_class": counts,
        "classes": [{"wnid": w, "name": n, "imagenet_index": i} for w, n, i in CLASSES],
        "num_classes": 1000,
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
        "extract_seconds": round(time.perf_counter() - t0, 1),
    }
    if hasattr(os, "sync"):
        os.sync()  # every image on disk before the marker says the folder is complete
    atomic_write_text(staging / MARKER, json.dumps(manifest, indent=1) + "\n")
    if out.is_dir():
        out.rmdir()  # empty (checked above)
    os.replace(staging, out)
    return out


def _unpack(path: Path, staging: Path, progress: bool, total: int | None) -> dict:
    """Write the archive's images into ``staging`` (files a killed run wrote whole are kept); returns the count
    per split and class. ``total``: the images expected, for the progress bar (None: an archive of your own)."""
    counts = {s: {w: 0 for w, _, _ in CLASSES} for s in SPLITS}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="img", desc="extracting Imagenette", dynamic_ncols=True)
    try:
        with tarfile.open(path, mode="r|*") as tar:  # a stream: one pass, no index of 13,000 members in memory
            for member in tar:
                target = _member_target(member.name) if member.isfile() else None
                if target is None:
                    continue
                dest = staging.joinpath(*target)
                if len(target) == 3:
                    counts[target[0]][target[1]] += 1
                    if bar is not None:
                        bar.update(1)
                if dest.is_file() and dest.stat().st_size == member.size:
                    continue  # written by an earlier, interrupted run
                dest.parent.mkdir(parents=True, exist_ok=True)
                part = dest.with_name(dest.name + ".part")
                with tar.extractfile(member) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(part, dest)  # an image file is either whole or absent
    except (tarfile.TarError, EOFError, OSError) as err:
        raise ValueError(
            f"cannot read {path} as the Imagenette archive ({type(err).__name__}: {err}); the files written so far "
            f"stay in {staging} and are reused by the next run. If the archive is damaged, delete it and download "
            "it again (`dit-data imagenette OUT`)."
        ) from None
    finally:
        if bar is not None:
            bar.close()
    return counts


def _check_counts(path: Path, counts: dict, checksum: bool) -> dict:
    """The images per split; an error for a class without images, or (a checked archive) other totals."""
    totals = {s: sum(c.values()) for s, c in counts.items()}
    empty = [f"{s}/{w}" for s, c in counts.items() for w, n in c.items() if n == 0]
    if empty:
        raise ValueError(f"{path} is not an Imagenette archive in the {ARCHIVE_ROOT}/{{train,val}}/<wnid>/ layout: "
                         f"no images for {empty[:4]}{' ...' if len(empty) > 4 else ''}")
    if checksum and totals != COUNTS:
        raise ValueError(f"{path} passed its checksum but holds {totals} images, not {COUNTS}; please report this")
    return totals


# ---------------------------------------------------------------------------------------------------------
# An archive in Imagenette's layout, made from generated images
# ---------------------------------------------------------------------------------------------------------


def _fake_jpeg(args) -> bytes:
    """One JPEG of class ``c``: a smooth colour field in the class's hue with a class-specific shape on it."""
    from PIL import Image, ImageDraw

    c, seed, short, quality = args
    rng = np.random.default_rng(seed)
    long = int(short * rng.uniform(1.0, 1.5))
    w, h = (long, short) if rng.random() < 0.7 else (short, long)
    hue = np.array([(37 * c) % 256, (91 * c + 60) % 256, (151 * c + 120) % 256], dtype=np.float64)
    base = np.clip(hue + rng.normal(0, 40, (6, 6, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(base).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(img)
    s = int(short * rng.uniform(0.25, 0.5))
    x, y = int(rng.integers(0, w - s)), int(rng.integers(0, h - s))
    colour = tuple(int(v) for v in (255 - hue))
    kind = c % 5
    if kind == 0:
        draw.ellipse((x, y, x + s, y + s), fill=colour)
    elif kind == 1:
        draw.rectangle((x, y, x + s, y + s), fill=colour)
    elif kind == 2:
        draw.polygon([(x + s // 2, y), (x, y + s), (x + s, y + s)], fill=colour)
    elif kind == 3:
        for k in range(0, s, max(2, s // 6)):
            draw.line((x, y + k, x + s, y + k), fill=colour, width=max(1, s // 16))
    else:
        draw.ellipse((x, y, x + s, y + s), outline=colour, width=max(2, s // 8))
    if c >= 5:  # the second five classes: the shape twice
        draw.rectangle((w - x - s // 3, h - y - s // 3, w - x, h - y), fill=colour)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_archive(
    path: str | os.PathLike,
    train_per_class: int | None = 2,
    val_per_class: int | None = 1,
    short_side: int = 320,
    seed: int = 0,
    workers: int = 1,
    quality: int = 85,
    compresslevel: int = 1,
) -> Path:
    """Write a ``.tgz`` in Imagenette's layout from generated JPEGs; returns its path.

    ``train_per_class``/``val_per_class``: images per class, or None for Imagenette's own counts (9,469 and 3,925
    over the 10 classes, as evenly as they divide). Images have a short side of ``short_side`` pixels (the 320 px
    release) and a class-specific colour and shape, so a model can learn to tell the classes apart. Written
    atomically; ``workers`` processes encode the JPEGs. No download, nothing real: for tests, smoke runs and
    ``benchmarks/gpu_track.sh``, where a machine without internet measures the GPU track on data of Imagenette's
    size and count.
    """
    from ..atomic import atomic_write

    def split_counts(per_class, total):
        if per_class is not None:
            return [int(per_class)] * len(CLASSES)
        q, r = divmod(total, len(CLASSES))
        return [q + (i < r) for i in range(len(CLASSES))]

    jobs, names = [], []
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        val_index = 1
        for c, ((wnid, _, _), n) in enumerate(zip(CLASSES, split_counts(per_class, COUNTS[split]))):
            for k in range(n):
                if split == "train":
                    fname = f"{wnid}_{k + 1}.JPEG"
                else:
                    fname = f"ILSVRC2012_val_{val_index:08d}.JPEG"
                    val_index += 1
                names.append(f"{ARCHIVE_ROOT}/{split}/{wnid}/{fname}")
                jobs.append((c, seed * 1_000_003 + len(jobs), short_side, quality))
    csv_lines = ["path,noisy_labels_0,noisy_labels_1,noisy_labels_5,noisy_labels_25,noisy_labels_50,is_valid"]
    for name in names:
        _, split, wnid, fname = name.split("/")
        csv_lines.append(f"{split}/{wnid}/{fname},{wnid},{wnid},{wnid},{wnid},{wnid},{split == 'val'}")

    def add(tar, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        tar.addfile(info, io.BytesIO(data))

    def write(f) -> None:
        with tarfile.open(fileobj=f, mode="w:gz", compresslevel=compresslevel) as tar:
            add(tar, f"{ARCHIVE_ROOT}/{NOISY_CSV}", ("\n".join(csv_lines) + "\n").encode())
            if workers > 1:
                import multiprocessing

                # fork where there is one: the workers only encode JPEGs, and spawn would need an importable main
                method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
                with multiprocessing.get_context(method).Pool(workers) as pool:
                    for name, data in zip(names, pool.imap(_fake_jpeg, jobs, chunksize=32)):
                        add(tar, name, data)
            else:
                for name, job in zip(names, jobs):
                    add(tar, name, _fake_jpeg(job))

    return atomic_write(path, write)
