"""A teacher's features of every training image, extracted once beside its latents, for representation alignment.

REPA pulls the DiT's hidden tokens towards a pretrained encoder's features of the clean image. Running DINOv2
ViT-B/14 in every training step would cost more than a large part of the step itself, so, like the latents,
the features are computed once: :func:`extract_features` encodes every image of a latent extraction (the same
files in the same order, the same crop, the plain and the mirrored image) with the teacher and stores its
patch tokens in ``<latents>/teachers/<teacher>/``, in the latents' format (:mod:`.store`): shards
``feat-XXXXX.npy`` of shape ``(n, 2, T, D)`` (axis 1: plain, mirrored; ``T`` tokens of the teacher's grid, 16 x
16 for DINOv2 at 224 px; float16), a ``manifest.json`` with a sha256 per shard, written atomically, resumed
after an interruption with the same result, and checked by :func:`verify_features`. Training then pays only for
the projector: :class:`TeacherFeatureDataset` serves ``(latent, label, features)``, the features of the view
(plain or mirrored) the latent came from, pooled to the DiT's token grid.

Size: ``2 T D`` float16 numbers per image, 786 KB for DINOv2-B at 224 px: 7.5 GB for the 9,469 Imagenette
training images, about 1 TB for ImageNet's 1.28 M (REPA runs its encoder in every step instead).

``python -m dit_core.latents.features LATENTS [--teacher dinov2-vitb14] [--weights FILE | --download]``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from .store import end_pass, pass_bar, publish_manifest, read_manifest, sha256_file, write_json

FORMAT = "dit-teacher-features"
MANIFEST = "manifest.json"
STATE = "state.json"
TEACHERS_DIR = "teachers"


def _shard_name(index: int) -> str:
    return f"feat-{index:05d}.npy"


def _settings(latents: dict, teacher: str, dim: int, grid: int) -> dict:
    return {"format": FORMAT, "teacher": teacher, "dim": int(dim), "grid": int(grid), "count": latents["count"],
            "fingerprint": latents["dataset"]["fingerprint"], "image_size": latents["image_size"],
            "views": ["plain", "hflip"], "storage_dtype": "float16"}


@torch.no_grad()
def extract_features(latents_dir: str | os.PathLike, teacher="dinov2-vitb14", *, name: str | None = None,
                     weights: str | None = None, download: bool = False, batch_size: int = 64, device=None,
                     shard_size: int = 4096, max_batches: int | None = None, progress: bool = True) -> dict:
    """Encode every image of the latent extraction in ``latents_dir`` with ``teacher`` and store the features
    in ``latents_dir/teachers/<name>``; returns the manifest (or, stopped by ``max_batches``, the progress
    state with ``complete`` False). ``teacher``: a DINOv2 name (weights from ``weights`` or the hub cache, or
    downloaded with ``download``), or any module with ``feature_map(images) -> (N, D, g, g)`` and ``dim`` (then
    pass ``name``). The images are read as the latents were: same folder, crop and size; a changed folder is
    an error."""
    from ..data.images import ImageFolderDataset
    from ..runtime import resolve_device
    from ..teachers import load_dinov2

    latents_dir = Path(latents_dir)
    latents = read_manifest(latents_dir)
    device = resolve_device(device)
    if isinstance(teacher, str):
        name = name or teacher
        teacher = load_dinov2(weights or teacher, download=download, device=device)
    elif name is None:
        raise ValueError("pass name= for a teacher given as a module")
    teacher = teacher.to(device).eval()
    images = ImageFolderDataset(latents["dataset"]["root"], latents["image_size"], split=latents["dataset"]["split"],
                                mode="RGB", flip=False, center_crop=latents.get("center_crop", "adm"))
    from .extract import dataset_fingerprint

    if dataset_fingerprint(images) != latents["dataset"]["fingerprint"]:
        raise ValueError(f"the images in {latents['dataset']['root']} changed since the latents were extracted; "
                         "extract the latents again first")
    probe = teacher.feature_map(torch.zeros(1, 3, latents["image_size"], latents["image_size"], device=device))
    settings = _settings(latents, name, probe.shape[1], probe.shape[-1])
    out = latents_dir / TEACHERS_DIR / name
    state = _start_or_resume(out, settings, shard_size)
    if state.get("complete"):
        return state
    count, shard_size = settings["count"], state["shard_size"]
    tokens = settings["grid"] ** 2
    # batches end at multiples of batch_size and at shard ends: a resumed run encodes the same batches
    bounds = sorted({*range(0, count, batch_size), *range(0, count, shard_size), state["done"], count})
    batches = [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if lo >= state["done"]][:max_batches]
    bar = pass_bar(progress, count, state["done"], f"features ({name})")
    t0 = time.perf_counter()
    try:
        for lo, hi in batches:
            shard = lo // shard_size
            x = torch.stack([_load(images, i) for i in range(lo, hi)]).to(device)
            maps = teacher.feature_map(torch.cat([x, x.flip(-1)])).float()
            feats = maps.flatten(2).transpose(1, 2).reshape(2, hi - lo, tokens, -1).transpose(0, 1)
            rows = min(shard_size, count - shard * shard_size)
            path = out / (_shard_name(shard) + ".partial")
            arr = np.lib.format.open_memmap(path, mode="r+" if path.exists() else "w+", dtype=np.float16,
                                            shape=(rows, 2, tokens, settings["dim"]))
            arr[lo - shard * shard_size : hi - shard * shard_size] = feats.cpu().numpy().astype(np.float16)
            arr.flush()
            del arr
            state["done"] = hi
            if hi == shard * shard_size + rows:  # the shard is full: checksum it and move it into place
                state["shards"].append({"index": shard, "file": _shard_name(shard), "sha256": sha256_file(path)})
                os.replace(path, out / _shard_name(shard))
            write_json(out / STATE, state)
            if bar is not None:
                bar.update(hi - lo)
    finally:
        if bar is not None:
            bar.close()
    return end_pass(out, state, count, t0) or publish_manifest(out, {k: v for k, v in state.items() if k != "done"})


def _load(images, index: int) -> torch.Tensor:
    try:
        return images.load(index)[0]
    except Exception:  # noqa: BLE001 - an undecodable image: zeros (the latents leave it out anyway)
        return torch.zeros(3, images.image_size, images.image_size)


def _start_or_resume(out: Path, settings: dict, shard_size: int) -> dict:
    for path, finished in ((out / MANIFEST, True), (out / STATE, False)):
        if path.is_file():
            old = json.loads(path.read_text())
            diffs = [f"{k}: {old.get(k)!r} -> {v!r}" for k, v in settings.items() if old.get(k) != v]
            if diffs:
                raise ValueError(f"{out} holds features with other settings ({'; '.join(diffs)}); remove the "
                                 "folder to extract them again")
            if finished:
                return {**old, "complete": True}
            print(f"resuming: {old['done']} of {old['count']} images already encoded in {out}")
            return old
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no feature extraction; remove it or choose another name")
    out.mkdir(parents=True, exist_ok=True)
    state = {**settings, "shard_size": int(shard_size), "done": 0, "shards": [],
             "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json(out / STATE, state)
    return state


def verify_features(folder: str | os.PathLike, checksums: bool = True) -> list[str]:
    """The problems of a finished feature extraction (missing or changed shards, shapes, non-finite values);
    an empty list when it is sound."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return [f"no finished feature extraction in {folder} (no {MANIFEST}); run python -m dit_core.latents.features"]
    m = json.loads((folder / MANIFEST).read_text())
    problems, tokens = [], m["grid"] ** 2
    expected = -(-m["count"] // m["shard_size"])
    if len(m["shards"]) != expected:
        problems.append(f"{len(m['shards'])} shards listed, {expected} expected")
    for rec in m["shards"]:
        path = folder / rec["file"]
        if not path.is_file():
            problems.append(f"{rec['file']} is missing")
            continue
        if checksums and sha256_file(path) != rec["sha256"]:
            problems.append(f"{rec['file']}: checksum mismatch")
            continue
        arr = np.load(path, mmap_mode="r")
        rows = min(m["shard_size"], m["count"] - rec["index"] * m["shard_size"])
        if arr.shape != (rows, 2, tokens, m["dim"]):
            problems.append(f"{rec['file']}: shape {arr.shape}, expected {(rows, 2, tokens, m['dim'])}")
        elif not np.isfinite(np.asarray(arr, dtype=np.float32)).all():
            problems.append(f"{rec['file']}: non-finite values")
    return problems


# ----------------------------------------------------------------------------------------------------------
# Reading them in training
# ----------------------------------------------------------------------------------------------------------


class TeacherFeatureDataset(torch.utils.data.Dataset):
    """Latents with their teacher features: item ``i`` is ``(z, label, f)``, ``f`` the ``(grid^2, D)`` features
    of the view (plain or mirrored) ``z`` came from, pooled to the DiT's ``grid``. ``z`` and the view are drawn
    exactly as :class:`~dit_core.latents.LatentDataset` draws them; its attributes are passed through."""

    def __init__(self, latents, folder: str | os.PathLike, grid: int):
        self.latents, self.folder, self.grid = latents, Path(folder), int(grid)
        problems = verify_features(self.folder, checksums=False)
        if problems:
            raise ValueError(f"teacher features in {self.folder} cannot be used: {'; '.join(problems)}")
        self.manifest = json.loads((self.folder / MANIFEST).read_text())
        if self.manifest["fingerprint"] != latents.manifest["dataset"]["fingerprint"]:
            raise ValueError(f"the teacher features in {self.folder} were extracted from other images than the "
                             f"latents in {latents.path}")
        self.teacher_dim = int(self.manifest["dim"])
        self._shards = None

    def __getattr__(self, name):  # classes, num_classes, sample_shape, latent_shape, vae, scale, flip, ...
        if name in ("latents", "__setstate__") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.latents, name)

    def __len__(self) -> int:
        return len(self.latents)

    def __getstate__(self):
        return {**self.__dict__, "_shards": None}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def features(self, index: int, view: int) -> torch.Tensor:
        from ..teachers import token_features

        if self._shards is None:
            self._shards = [np.load(self.folder / r["file"], mmap_mode="r")
                            for r in sorted(self.manifest["shards"], key=lambda r: r["index"])]
        j = int(self.latents.indices[index])
        size = self.manifest["shard_size"]
        f = torch.from_numpy(np.asarray(self._shards[j // size][j % size, view], dtype=np.float32))
        g = self.manifest["grid"]
        return token_features(f.T.reshape(1, -1, g, g), self.grid)[0]

    def __getitem__(self, index: int):
        base = self.latents
        view = int(torch.randint(2, ())) if base.flip else 0
        mean, std = base.moments(index, view)
        z = mean + std * torch.randn(mean.shape) if base.sample else mean
        return z, int(base.labels[base.indices[index]]), self.features(index, view)


def teacher_folder(latents_dir: str | os.PathLike, teacher: str) -> Path:
    """The feature folder ``--repa-teacher`` names for these latents: ``auto`` (the one set extracted beside
    them), a teacher name (``<latents>/teachers/<name>``), or a folder."""
    if teacher not in ("auto", "cnn") and Path(teacher).is_dir():
        return Path(teacher)
    root = Path(latents_dir) / TEACHERS_DIR
    found = sorted(p.name for p in root.iterdir() if (p / MANIFEST).is_file()) if root.is_dir() else []
    if teacher == "auto" and len(found) == 1:
        return root / found[0]
    if teacher in found:
        return root / teacher
    raise FileNotFoundError(
        f"no teacher features {'' if teacher == 'auto' else repr(teacher) + ' '}beside the latents in {latents_dir} "
        f"(found: {found or 'none'}); extract them with `python -m dit_core.latents.features {latents_dir} "
        "--teacher dinov2-vitb14 --download`" + (", or name one with --repa-teacher" if len(found) > 1 else ""))


def main(argv=None) -> int:
    """``python -m dit_core.latents.features LATENTS --teacher dinov2-vitb14 [--weights FILE] [--download]``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m dit_core.latents.features", description=main.__doc__)
    p.add_argument("latents", help="a finished dit-extract-latents folder")
    p.add_argument("--teacher", default="dinov2-vitb14", help="dinov2-vits14, dinov2-vitb14 (REPA) or dinov2-vitl14")
    p.add_argument("--weights", default=None, help="the released .pth file (default: torch's hub cache)")
    p.add_argument("--download", action="store_true", help="download the released weights if they are not cached")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    result = extract_features(args.latents, args.teacher, weights=args.weights, download=args.download,
                              batch_size=args.batch_size, device=args.device)
    folder = Path(args.latents) / TEACHERS_DIR / args.teacher
    problems = verify_features(folder)
    print(f"{result['count']} images, {result['grid']}x{result['grid']} tokens of {result['dim']} in {folder}"
          + ("" if not problems else f"; PROBLEMS: {problems}"))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
