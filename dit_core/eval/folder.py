"""A judge for any folder: a classifier fitted on the folder's own files, with its ceiling on files it never saw.

The bench folders and the shapes have judges fitted on another seed's rendered images (:mod:`dit_core.eval.bench`,
:mod:`dit_core.eval.shapes`). A reader's folder has no other seed: :class:`FolderJudge` is fitted on four fifths of
each class's files, prepared exactly as the trainer prepares them (its ``image_size``, crop and channels), and its
ceiling (:attr:`val_accuracy`) is its accuracy on the fifth it never saw. It is the same small network on the
image's silhouette (each pixel's colour distance from the border's colour) as the other judges: made for pictures of
a thing on a background, it says less about photographs whose class is in their colours or textures, and its
ceiling then shows it. The guidance chosen after training (:mod:`dit_core.eval.guidance`) and chapter 5b use it.
"""

from __future__ import annotations

import time

import torch

from .shapes import SilhouetteJudge

#: Every this-many-th file of a class is held out for the ceiling.
HELD_OUT_EVERY = 5
#: At most this many files of a class are read.
MAX_PER_CLASS = 400


class FolderJudge(SilhouetteJudge):
    """A judge fitted on the files of the ImageFolder ``root`` as a trainer reads them at ``image_size`` with
    ``crop`` and ``mode``. ``flip``: the trainer's flips (True, False, or the labels whose files flip): the judge
    learns those classes from their mirror images too. ``asymmetric``: the names of the classes a mirror changes
    (the probe's, :mod:`dit_core.data.probe`): the judge learns their mirror images as classes of their own,
    ``"<class> (mirrored)"``, so it can say when a sample is drawn mirrored (:meth:`mirrored_rate`). Attributes
    beside the judge interface: ``root``, ``num_train``, ``num_val``, ``seconds``."""

    def __init__(self, root, image_size: int, crop: str = "object", mode: str = "RGB", flip=False, asymmetric=(),
                 epochs: int = 12, seed: int = 0, max_per_class: int = MAX_PER_CLASS):
        from ..data.images import LOAD_ERRORS, ImageFolderDataset, flips_label
        from ..data.probe import _spread
        from .bench import _shift
        from .shapes import MIRRORED

        started = time.perf_counter()
        data = ImageFolderDataset(root, image_size, mode=mode, flip=False, center_crop=crop)
        self.root, self.image_size, self.crop, self.mode = str(data.root), int(image_size), crop, mode
        per_class: dict[int, list[int]] = {}
        for i, (_, label) in enumerate(data.samples):
            per_class.setdefault(label, []).append(i)
        split = {"train": ([], []), "val": ([], [])}
        for _, idx in sorted(per_class.items()):
            for k, i in enumerate(idx[j] for j in _spread(len(idx), max_per_class)):
                try:
                    x, y = data.load(i)
                except LOAD_ERRORS:
                    continue
                xs, ys = split["val" if k % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else "train"]
                xs.append(x)
                ys.append(y)
        if not split["train"][0]:
            raise ValueError(f"no readable files in {root} to fit a judge on")
        train, val = ((torch.stack(xs) if xs else torch.empty(0, *data.sample_shape), torch.tensor(ys, dtype=torch.long))
                      for xs, ys in split.values())
        x, y = train
        classes = [str(c) for c in data.classes]
        self.asymmetric = [c for c in classes if c in set(asymmetric)]
        other = {classes.index(c): len(classes) + k for k, c in enumerate(self.asymmetric)}
        # the classes the trainer flips: their mirror images are the class too; those a mirror changes: another class
        keep = torch.tensor([int(c) in other or flips_label(flip, int(c)) for c in y], dtype=torch.bool)
        mirrored_labels = torch.tensor([other.get(int(c), int(c)) for c in y], dtype=torch.long)
        if keep.any():
            train = (torch.cat([x, x[keep].flip(-1)]), torch.cat([y, mirrored_labels[keep]]))
        self.fit(classes + [c + MIRRORED for c in self.asymmetric], train, val, epochs, seed, augment=_shift)
        self.seconds = time.perf_counter() - started
