"""The folder's own answers before training: which classes may be flipped, where the objects are, how large.

The paper's only augmentation is a random horizontal flip (Peebles & Xie 2023, Sec. 5), right for ImageNet, whose
classes do not change in a mirror. A reader's folder may hold letters, arrows, hands or text, and a model taught
that a mirrored L is an L draws mirrored Ls. Rather than asking the reader, :func:`probe_folder` asks the folder:

- **the mirror test.** A small CNN (:class:`dit_core.teachers.PixelTeacher`, seconds on one core) learns, for
  every class, to tell files from their mirror images, on two thirds of each class's files prepared as the trainer
  prepares them; on the held-out third it is right about half the time for a class whose files look as likely
  mirrored as not (circles, the letter A) and nearly always for one that changes (the letter L). Classes it tells
  apart at least :data:`MIRROR_THRESHOLD` of the time, clearly more than chance for the files tested
  (:func:`changed_by_mirror`), are not flipped, the others are (``flip: auto``).
- **the objects.** For each file, the object's box and the square window that keeps it
  (:func:`dit_core.data.objects.locate`): the share of files whose object the centre crop would cut, and the
  object's size at the training size.

Flipping only some classes leaves the others their doubled data. EDM's alternative (Karras et al. 2022, App. C:
flip every file, give the model the flip as a condition and sample with it off, so the flip cannot leak into the
samples) also keeps the doubled data for the asymmetric classes, but its model must learn both orientations of
every such class in the same steps; on the bench of :mod:`dit_core.data.bench` the record
(``benchmarks/results/own-images.md``) measures what flips buy where they are harmless, which bounds what the
conditioning could add.

:func:`apply_probe` runs the probe for a training run (in the main process; the others read its result), keeps it
in ``<out>/probe.json`` so a resumed run decides the same, and sets the dataset's flips. The pre-flight report
(:mod:`dit_core.train.preflight`) states what it decided and why.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

#: A class whose files a classifier tells from their mirror images this often (held-out files) is not flipped,
MIRROR_THRESHOLD = 0.75
#: provided the share is clearly above chance for the number of files tested: the lower end of its 95 % Wilson
#: interval at least this (16 of 16 pass, 12 of 16 do not).
MIRROR_LOWER = 0.6
#: At most this many files of a class take part in the mirror test (two thirds train the classifier).
MIRROR_FILES = 240
#: Adam steps of the mirror test's classifier (batches of 64): about 20 passes over its files, at least 60 and at
#: most this many.
MIRROR_STEPS = 300
#: At most this many files, spread evenly over the folder, are located for the object figures.
OBJECT_FILES = 600
PROBE_FILE = "probe.json"
PROBE_VERSION = 1


@dataclass
class FolderProbe:
    """What :func:`probe_folder` found. ``mirror``: per class name, the held-out share of files and mirror images
    the classifier told apart (empty when the test did not run); ``flipped``: the labels of the classes that keep
    their flips; ``classes``: the class names by label; the object figures over ``located`` files: ``centre_cut``
    (the share whose object the centre crop cuts), ``no_object`` (the share where nothing stands out),
    ``object_size`` (median longer side of the object over the window's side) and ``image_size``."""

    classes: list
    image_size: int | None
    crop: str | None
    num_files: int
    located: int = 0
    centre_cut: float = 0.0
    no_object: float = 0.0
    object_size: float = 0.0
    mirror: dict = field(default_factory=dict)
    mirror_tested: dict = field(default_factory=dict)
    flipped: list | None = None
    seconds: float = 0.0
    version: int = PROBE_VERSION

    def flip_setting(self):
        """The dataset's ``flip``: True (every class), False (none) or the set of labels that flip."""
        labels = [i for i, c in enumerate(self.classes) if c]
        if self.flipped is None or set(labels) <= set(self.flipped):
            return True
        return frozenset(self.flipped) if self.flipped else False

    def asymmetric(self) -> list[str]:
        """The classes the mirror test found changed by a mirror (:func:`changed_by_mirror`)."""
        return [c for c, share in self.mirror.items() if changed_by_mirror(share, self.mirror_tested.get(c, 0))]

    def object_px(self) -> float | None:
        return self.object_size * self.image_size if self.image_size else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "FolderProbe":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def changed_by_mirror(share: float, tested: int) -> bool:
    """Whether a class whose held-out files and mirror images were told apart ``share`` of ``tested`` times is
    changed by a mirror: ``share`` at least :data:`MIRROR_THRESHOLD` and the lower end of its 95 % Wilson interval
    at least :data:`MIRROR_LOWER`."""
    if tested < 1 or share < MIRROR_THRESHOLD:
        return False
    z = 1.96
    centre = (share + z * z / (2 * tested)) / (1 + z * z / tested)
    half = z * math.sqrt(share * (1 - share) / tested + z * z / (4 * tested * tested)) / (1 + z * z / tested)
    return centre - half >= MIRROR_LOWER


def _spread(n: int, count: int) -> list[int]:
    """``count`` indices spread evenly over ``range(n)`` (all of them when ``count >= n``)."""
    if count >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / max(1, count - 1)) for i in range(count)})


def locate_files(dataset, max_files: int = OBJECT_FILES) -> dict:
    """The object figures of :class:`FolderProbe` over up to ``max_files`` files of an image folder ``dataset``."""
    from .images import LOAD_ERRORS, load_image
    from .objects import locate

    found = []
    for i in _spread(len(dataset.samples), max_files):
        try:
            found.append(locate(load_image(dataset.samples[i][0], dataset.mode)))
        except LOAD_ERRORS:
            continue
    if not found:
        return {}
    sizes = [f.size for f in found if f.box is not None]
    return {"located": len(found), "centre_cut": float(np.mean([f.centre_cut for f in found])),
            "no_object": float(np.mean([f.box is None for f in found])),
            "object_size": float(np.median(sizes)) if sizes else 0.0}


def mirror_test(images: torch.Tensor, labels: torch.Tensor, classes, seed: int = 0,
                steps: int | None = None) -> tuple[dict, dict]:
    """Per class, the share of held-out files and their mirror images that a classifier fitted on the other files
    tells apart: ``({class name: share}, {class name: held-out images tested})``. ``images`` (N, C, H, W) in
    [-1, 1] prepared as the trainer prepares them, unflipped; every third file of a class is held out. Classes
    with fewer than 6 files are not tested."""
    from ..teachers import fit_pixel_teacher

    train_idx, test_idx = [], []
    for label in range(len(classes)):
        idx = torch.nonzero(labels == label).flatten().tolist()
        if len(idx) < 6:
            continue
        idx = [idx[i] for i in _spread(len(idx), MIRROR_FILES)]
        test_idx += idx[2::3]
        train_idx += [j for k, j in enumerate(idx) if k % 3 != 2]
    if not test_idx:
        return {}, {}

    def both(idx):  # each file as class 2k, its mirror image as class 2k + 1
        x = images[idx]
        return torch.cat([x, x.flip(-1)]), torch.cat([2 * labels[idx], 2 * labels[idx] + 1])

    x, y = both(train_idx)
    if steps is None:  # about 20 passes over the files and their mirror images
        steps = max(60, min(MIRROR_STEPS, round(20 * len(x) / 64)))
    net = fit_pixel_teacher(x, y, 2 * len(classes), steps=steps, seed=seed, flip=False)
    xt, yt = both(test_idx)
    with torch.no_grad():
        logits = torch.cat([net(xt[i : i + 512]) for i in range(0, len(xt), 512)])
    pair = torch.stack([logits[torch.arange(len(yt)), yt // 2 * 2], logits[torch.arange(len(yt)), yt // 2 * 2 + 1]], 1)
    right = pair.argmax(1) == yt % 2  # the classifier names the orientation, within the true class
    shares, counts = {}, {}
    for label, name in enumerate(classes):
        here = (yt // 2) == label
        if here.any():
            shares[str(name)] = float(right[here].float().mean())
            counts[str(name)] = int(here.sum())
    return shares, counts


def probe_folder(dataset, mirror: bool = True, seed: int = 0) -> FolderProbe:
    """Probe an :class:`~dit_core.data.images.ImageFolderDataset` as the trainer reads it (its ``image_size``,
    ``mode`` and crop): the object figures, and with ``mirror`` the mirror test and the classes it flips."""
    from .images import LOAD_ERRORS

    started = time.perf_counter()
    probe = FolderProbe(classes=[str(c) for c in dataset.classes], image_size=dataset.image_size,
                        crop=dataset.center_crop, num_files=len(dataset.samples))
    for key, value in locate_files(dataset).items():
        setattr(probe, key, value)
    if mirror and dataset.image_size:
        per_class: dict[int, list[int]] = {}
        for i, (_, label) in enumerate(dataset.samples):
            per_class.setdefault(label, []).append(i)
        xs, ys = [], []
        for _, idx in sorted(per_class.items()):
            for i in (idx[k] for k in _spread(len(idx), MIRROR_FILES)):
                try:
                    x, y = dataset.load(i)
                except LOAD_ERRORS:
                    continue
                xs.append(x)
                ys.append(y)
        if xs:
            with torch.random.fork_rng(devices=[]):
                probe.mirror, probe.mirror_tested = mirror_test(torch.stack(xs), torch.as_tensor(ys), dataset.classes,
                                                                seed=seed)
            changed = set(probe.asymmetric())
            probe.flipped = [i for i, c in enumerate(dataset.classes) if c and str(c) not in changed]
    probe.seconds = time.perf_counter() - started
    return probe


def _matches(probe: FolderProbe, dataset) -> bool:
    return (probe.version == PROBE_VERSION and probe.classes == [str(c) for c in dataset.classes]
            and probe.num_files == len(dataset.samples) and probe.image_size == dataset.image_size
            and probe.crop == dataset.center_crop)


def apply_probe(cfg, dataset, out: Path, procs=None):
    """Run the probe a training run asks for and apply its decisions to ``dataset``; returns the dataset.

    It runs on an image folder when ``cfg.flip`` is ``"auto"`` or ``cfg.crop`` is ``"object"``: the main process
    probes (or reads ``<out>/probe.json`` of an earlier start of the same run), the others wait and read the file.
    With ``flip: auto`` the dataset flips the classes the mirror test keeps; the probe is kept as ``dataset.probe``
    for the pre-flight report. Latents and other datasets get ``flip: auto`` as true (the paper's flips)."""
    from ..atomic import atomic_write_text
    from .images import ImageFolderDataset

    if not isinstance(dataset, ImageFolderDataset):
        if cfg.flip == "auto" and hasattr(dataset, "flip"):
            dataset.flip = True
        return dataset
    if not (cfg.flip == "auto" or getattr(cfg, "crop", "adm") == "object"):
        return dataset
    path = Path(out) / PROBE_FILE
    if procs is None or procs.is_main:  # procs None: this process alone
        probe = None
        if path.is_file():
            try:
                probe = FolderProbe.from_dict(json.loads(path.read_text()))
            except (ValueError, TypeError):
                probe = None
        if probe is None or not _matches(probe, dataset) or (cfg.flip != False and not probe.mirror):  # noqa: E712
            probe = probe_folder(dataset, mirror=cfg.flip is not False, seed=cfg.seed)
            Path(out).mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(probe.to_dict(), indent=1) + "\n")
    if procs is not None and procs.distributed:  # the others wait for the main process's file
        torch.distributed.barrier()
    probe = FolderProbe.from_dict(json.loads(path.read_text()))
    if cfg.flip == "auto":
        dataset.flip = probe.flip_setting() if probe.mirror else True
    dataset.probe = probe
    return dataset
