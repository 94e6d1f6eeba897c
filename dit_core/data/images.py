"""Reading an ImageFolder dataset with PIL: the layout, the ADM center crop, and horizontal flips.

DiT trains on ImageNet stored as ``root/<class>/<image>`` (torchvision's ``ImageFolder`` layout), center
cropped the way ADM (Dhariwal & Nichol, 2021) does it, with a random horizontal flip as the only
augmentation (Peebles & Xie, 2023, Sec. 5). This module does the same with PIL and numpy alone, because
PyPI's torchvision does not import beside the CPU build of torch.

**Labels.** A class's label is its position among the sorted class folders, as in torchvision, unless the
dataset root holds a label map (:data:`LABEL_MAP`, ``label_map.json``; :func:`read_label_map`): then each folder
gets the label the map gives it, out of the map's ``num_classes``. Imagenette (``dit-data imagenette``) carries
one that gives its 10 classes their ImageNet-1k indices, so that a model trained on it and the official
ImageNet checkpoints mean the same class by the same number.

Real datasets hold bad files: zero-byte downloads, truncated JPEGs, HTML error pages saved as ``.jpg``,
CMYK or 16-bit images. :func:`load_image` is the single place that decides what happens to each of them,
so the dataset check (:mod:`dit_core.data.check`) reports exactly what the loader will do. A file that
cannot be decoded never stops an epoch: :class:`ImageFolderDataset` warns once and serves another image.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .crop import center_crop_arr

# The extensions torchvision's ImageFolder accepts (compared in lower case).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# Folder names taken as splits rather than classes when they sit directly under the root.
SPLIT_NAMES = ("train", "val", "test")

# What PIL raises on a bad file: OSError (truncated, not an image), ValueError and SyntaxError (broken
# headers), DecompressionBombError (an image so large it is likely an attack).
LOAD_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)

# PIL modes that hold more than 8 bits per channel; PIL's own convert() clips them to 255.
HIGH_BIT_DEPTH_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")


def is_image_file(name: str) -> bool:
    """True when ``name`` has one of the image extensions and is not a hidden file.

    Hidden files are left out: macOS writes ``._photo.jpg`` resource forks next to every image on
    some disks, and those are not images.
    """
    return not os.path.basename(name).startswith(".") and name.lower().endswith(IMG_EXTENSIONS)


def find_classes(directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
    """Class names are the sub-folders of ``directory``, sorted by name (as torchvision does).

    The label of a class is its position in that sorted list, so ``n01440764`` is 0 on ImageNet.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"dataset folder {str(directory)!r} does not exist; pass the folder that holds one "
            "sub-folder per class (root/<class>/<image>) or the train/ and val/ splits"
        )
    classes = sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise FileNotFoundError(
            f"no class folders in {str(directory)!r}: the layout must be root/<class>/<image> "
            "(or root/train/<class>/<image>); for a first run export the digits with `dit-data digits OUT`"
        )
    return classes, {name: i for i, name in enumerate(classes)}


def resolve_split(root: str | os.PathLike, split: str | None = None) -> Path:
    """The folder whose sub-folders are the classes.

    ``split`` given: ``root/split`` must exist. Not given: ``root/train`` when it exists (the ImageNet
    layout), else ``root`` itself.
    """
    root = Path(root)
    if split is not None:
        folder = root / split
        if not folder.is_dir():
            present = [s for s in SPLIT_NAMES if (root / s).is_dir()]
            raise FileNotFoundError(
                f"split {split!r} not found: {str(folder)!r} is not a folder"
                + (f" (splits present: {', '.join(present)})" if present
                   else " (this dataset has no split folders; pass split=None)")
            )
        return folder
    if (root / "train").is_dir():
        return root / "train"
    return root


#: The label map's file name, in the dataset root (beside ``train/`` and ``val/``) or in the class folder's parent.
LABEL_MAP = "label_map.json"
LABEL_MAP_FORMAT = "dit-label-map"


@dataclass(frozen=True)
class LabelMap:
    """Which label each class folder has, out of how many classes: ``index[folder]`` in ``0..num_classes-1``,
    with a readable ``names[folder]`` (the folder name when the map gives none)."""

    num_classes: int
    index: dict = field(default_factory=dict)
    names: dict = field(default_factory=dict)
    path: str | None = None

    def __post_init__(self):
        if self.num_classes < 1:
            raise ValueError(f"label map {self.path or ''}: num_classes must be at least 1, got {self.num_classes}")
        bad = {k: v for k, v in self.index.items() if not (isinstance(v, int) and 0 <= v < self.num_classes)}
        if bad:
            raise ValueError(f"label map {self.path or ''}: labels outside 0..{self.num_classes - 1}: {bad}")
        seen: dict[int, str] = {}
        for folder, label in self.index.items():
            if label in seen:
                raise ValueError(f"label map {self.path or ''}: folders {seen[label]!r} and {folder!r} share label {label}")
            seen[label] = folder

    def class_names(self) -> list[str]:
        """A list of ``num_classes`` names indexed by label: the mapped folders' names, "" for labels no folder has."""
        names = [""] * self.num_classes
        for folder, label in self.index.items():
            names[label] = self.names.get(folder) or folder
        return names

    def to_dict(self) -> dict:
        return {"format": LABEL_MAP_FORMAT, "num_classes": self.num_classes,
                "classes": {f: {"index": i, "name": self.names.get(f, f)} for f, i in sorted(self.index.items())}}


def read_label_map(folder: str | os.PathLike) -> LabelMap | None:
    """The label map that applies to the class folders in ``folder``, or None (labels by sorted position).

    Looked for as ``folder/label_map.json`` and, when ``folder`` is a split (``train``, ``val``, ``test``), in its
    parent, the dataset root. Format::

        {"format": "dit-label-map", "num_classes": 1000,
         "classes": {"n01440764": {"index": 0, "name": "tench"}, ...}}
    """
    folder = Path(folder)
    candidates = [folder / LABEL_MAP]
    if folder.name in SPLIT_NAMES:
        candidates.append(folder.parent / LABEL_MAP)
    for path in candidates:
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except ValueError as err:
            raise ValueError(f"label map {path} is not valid JSON ({err}); fix or delete it") from None
        if not isinstance(data, dict) or data.get("format") != LABEL_MAP_FORMAT or not isinstance(data.get("classes"), dict):
            raise ValueError(f"{path} is not a label map: expected a JSON object with \"format\": "
                             f"\"{LABEL_MAP_FORMAT}\", \"num_classes\" and \"classes\"; rename it if it is another file")
        classes = data["classes"]
        return LabelMap(num_classes=int(data.get("num_classes", len(classes))),
                        index={str(k): v["index"] if isinstance(v, dict) else v for k, v in classes.items()},
                        names={str(k): v.get("name", k) for k, v in classes.items() if isinstance(v, dict)},
                        path=str(path))
    return None


def write_label_map(root: str | os.PathLike, label_map: LabelMap) -> Path:
    """Write ``label_map`` to ``root/label_map.json`` (atomically)."""
    from ..atomic import atomic_write_text

    return atomic_write_text(Path(root) / LABEL_MAP, json.dumps(label_map.to_dict(), indent=1) + "\n")


def present_labels(dataset) -> list[int]:
    """The labels that occur in ``dataset`` (its ``targets``; a ``Subset`` counts its own items), sorted: the classes
    worth showing in a sample grid, which are not ``range(num_classes)`` when a label map spreads them out."""
    if isinstance(dataset, torch.utils.data.Subset):
        targets = getattr(dataset.dataset, "targets", None)
        if targets is not None:
            return sorted({int(targets[i]) for i in dataset.indices})
        dataset = dataset.dataset
    targets = getattr(dataset, "targets", None)
    if targets is None:
        return list(range(int(getattr(dataset, "num_classes", 0))))
    return sorted({int(t) for t in targets})


def make_samples(folder: Path, class_to_idx: dict[str, int]) -> tuple[list[tuple[str, int]], list[str]]:
    """All image files below each class folder, in a fixed order: classes sorted, files sorted.

    Returns ``(samples, ignored)``: ``samples`` is a list of ``(path, label)``; ``ignored`` lists the
    files whose extension is not an image extension (they are left out, as torchvision does).
    """
    samples, ignored = [], []
    for name in sorted(class_to_idx):
        label = class_to_idx[name]
        for dirpath, dirnames, filenames in sorted(os.walk(folder / name, followlinks=True)):
            dirnames.sort()
            for fname in sorted(filenames):
                path = os.path.join(dirpath, fname)
                if is_image_file(fname):
                    samples.append((path, label))
                else:
                    ignored.append(path)
    return samples, ignored


def _to_8bit(img: Image.Image) -> Image.Image:
    """A 16-bit or 32-bit grayscale image scaled into 8 bits (PIL's convert() would clip at 255)."""
    arr = np.asarray(img)
    if img.mode == "F":
        lo, hi = float(np.nanmin(arr)), float(np.nanmax(arr))
        scaled = (arr - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(arr)
    else:
        top = 65535.0 if arr.max(initial=0) <= 65535 else float(arr.max())
        scaled = arr.astype(np.float64) * (255.0 / top)
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8))


def load_image(path: str | os.PathLike, mode: str = "RGB") -> Image.Image:
    """Open, fully decode and convert one image to ``mode`` ("RGB" or "L").

    What happens to each kind of odd file (the dataset check reports the same):

    - zero-byte, not an image, truncated or otherwise undecodable: raises ``OSError`` (callers skip it);
    - 16-bit or 32-bit grayscale: scaled to 8 bits, then converted;
    - CMYK, palette, grayscale, RGBA: ``Image.convert(mode)``, which drops an alpha channel as the
      official DiT pipeline does.
    """
    if mode not in ("RGB", "L"):
        raise ValueError(f"mode must be 'RGB' (colour) or 'L' (grayscale), got {mode!r}")
    if os.path.getsize(path) == 0:
        raise OSError(f"{path}: zero-byte file")
    with Image.open(path) as img:
        img.load()  # decode now, so a truncated file fails here and not later
        if img.mode in HIGH_BIT_DEPTH_MODES:
            img = _to_8bit(img)
        return img.convert(mode) if img.mode != mode else img.copy()


#: The ways to bring a file to the training square (:func:`resize_to`).
CROPS = ("adm", "object", "resize")


def resize_to(pil_image: Image.Image, image_size: int | None, center_crop: str | None) -> Image.Image:
    """Bring an image to the training size: ``"adm"`` crop (the centre square, as DiT), ``"object"`` (the square
    of the short side placed where the object is, :func:`dit_core.data.objects.object_crop`; the centre square
    where nothing stands out), ``"resize"`` (squash to a square), or ``None`` (keep the image as it is; every
    image must then already have the same size)."""
    if image_size is None or center_crop is None:
        return pil_image
    if center_crop == "adm":
        return center_crop_arr(pil_image, image_size)
    if center_crop == "object":
        from .objects import object_crop

        return object_crop(pil_image, image_size)
    if center_crop == "resize":
        return pil_image.resize((image_size, image_size), resample=Image.BICUBIC)
    raise ValueError(f"center_crop must be one of {', '.join(CROPS)} or None, got {center_crop!r}")


def flips_label(flip, label: int) -> bool:
    """Whether files of class ``label`` are flipped at random: ``flip`` is a bool (every class or none) or a set
    of the labels that are."""
    if isinstance(flip, (bool, np.bool_)):
        return bool(flip)
    return int(label) in flip


def to_tensor(pil_image: Image.Image) -> torch.Tensor:
    """uint8 image (H, W[, C]) -> float32 tensor (C, H, W) in [-1, 1], as DiT's normalisation (mean 0.5,
    std 0.5) gives."""
    arr = np.asarray(pil_image, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    # numpy arithmetic: small torch ops in a loaded main process pay a thread-pool cost per call (~10x slower)
    x = arr.transpose(2, 0, 1).astype(np.float32) / np.float32(127.5) - np.float32(1.0)
    return torch.from_numpy(np.ascontiguousarray(x))


class ImageFolderDataset(torch.utils.data.Dataset):
    """Images from ``root/<class>/<image>`` (or ``root/<split>/<class>/<image>``) as DiT trains on them.

    ``dataset[i]`` is ``(x, label)``: ``x`` a float32 tensor (C, H, W) in [-1, 1] (C = 3 for mode "RGB",
    1 for "L"), cropped to ``image_size`` (``center_crop``: one of :data:`CROPS`) and flipped left-right with
    probability 1/2 when ``flip`` is true; ``flip`` may also be a set of labels, the classes whose files are
    flipped (:func:`flips_label`; the pre-flight probe decides it per class, :mod:`dit_core.data.probe`). Labels
    follow the sorted class names, as in torchvision.

    Bad files never stop an epoch: zero-byte files are left out when the folder is scanned (with a
    warning); a file that fails to decode when it is read is reported once and the next readable image
    (in index order, so the substitute is always the same) is served in its place. Run
    ``dit-data check ROOT`` to see every such file before training.

    Attributes: ``classes`` (name of each label), ``class_folders``, ``class_to_idx`` (folder -> label),
    ``num_classes``, ``label_map`` (or None), ``samples`` (list of ``(path, label)``), ``targets``, ``root`` (the
    folder that holds the classes), ``sample_shape`` (C, H, W) when ``image_size`` is set.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        image_size: int | None,
        split: str | None = None,
        mode: str = "RGB",
        flip: bool = True,
        center_crop: str | None = "adm",
    ):
        if mode not in ("RGB", "L"):
            raise ValueError(f"mode must be 'RGB' (colour) or 'L' (grayscale), got {mode!r}")
        if center_crop not in (*CROPS, None):
            raise ValueError(f"center_crop must be one of {', '.join(CROPS)} or None, got {center_crop!r}")
        self.root = resolve_split(root, split)
        self.image_size = image_size
        self.mode = mode
        self.flip = flip
        self.center_crop = center_crop
        self.classes, self.class_to_idx = find_classes(self.root)
        self.class_folders = list(self.classes)
        self.label_map = read_label_map(self.root)
        if self.label_map is not None:
            unmapped = [c for c in self.class_folders if c not in self.label_map.index]
            if unmapped:
                raise ValueError(
                    f"class folder(s) {unmapped[:5]} in {self.root} have no entry in the label map "
                    f"{self.label_map.path}; add them there (or remove the map to number classes by sorted folder name)"
                )
            self.class_to_idx = {c: self.label_map.index[c] for c in self.class_folders}
            self.classes = self.label_map.class_names()
        samples, _ = make_samples(self.root, self.class_to_idx)
        empty = [p for p, _ in samples if _file_size(p) == 0]
        if empty:
            warnings.warn(
                f"{len(empty)} zero-byte file(s) in {self.root} left out, e.g. {empty[0]} "
                "(run `dit-data check` for the full list)",
                stacklevel=2,
            )
            empty_set = set(empty)
            samples = [s for s in samples if s[0] not in empty_set]
        if not samples:
            raise FileNotFoundError(
                f"no readable images under {str(self.root)!r} (extensions {', '.join(IMG_EXTENSIONS)})"
            )
        counts = np.bincount([label for _, label in samples], minlength=len(self.classes))
        folder_labels = sorted(self.class_to_idx.values())
        if (counts[folder_labels] == 0).any():
            missing = [self.classes[i] for i in folder_labels if counts[i] == 0]
            warnings.warn(f"class folder(s) without images: {missing[:5]}; their labels are never served", stacklevel=2)
        self.samples = samples
        self.targets = [label for _, label in samples]
        self._bad: set[int] = set()  # indices that failed to decode (per process)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def sample_shape(self) -> tuple[int, int, int] | None:
        if self.image_size is None:
            return None
        return (3 if self.mode == "RGB" else 1, self.image_size, self.image_size)

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int) -> tuple[torch.Tensor, int]:
        """Image ``index`` cropped and converted, not flipped; raises ``OSError`` if it cannot be decoded."""
        path, label = self.samples[index]
        img = resize_to(load_image(path, self.mode), self.image_size, self.center_crop)
        return to_tensor(img), label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        n = len(self.samples)
        for step in range(n):
            i = (index + step) % n
            if i in self._bad:
                continue
            try:
                x, label = self.load(i)
            except LOAD_ERRORS as err:
                self._bad.add(i)
                warnings.warn(
                    f"skipping unreadable image {self.samples[i][0]} ({err}); serving the next image instead",
                    stacklevel=2,
                )
                continue
            if self.flip and torch.rand(()) < 0.5 and flips_label(self.flip, label):
                x = x.flip(-1)
            return x, label
        raise RuntimeError(
            f"none of the {n} images under {self.root} could be decoded; run `dit-data check {self.root}`"
        )

    def __repr__(self) -> str:
        return (
            f"ImageFolderDataset(root={str(self.root)!r}, images={len(self)}, classes={self.num_classes}, "
            f"image_size={self.image_size}, mode={self.mode!r}, flip={self.flip})"
        )


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1
