"""The judges of the test bench (:mod:`dit_core.data.bench`): which class a sample shows, whether it is mirrored,
whether its object is cut by the frame.

For each kind of bench folder, a :class:`BenchJudge` is a :class:`~dit_core.eval.shapes.ShapeNet` on the image's
silhouette, fitted on real files of another seed (:data:`JUDGE_SEED`, never a folder's own), rendered in memory,
encoded in their file format, decoded and brought to the training square exactly as a trainer with the given
``image_size`` and ``crop`` brings them. It knows one more class for each class that a mirror changes (``"L
(mirrored)"``): it learns from every real file and its mirror image, the mirror of an L labelled so, the mirror of an
A labelled A. Its ceiling (:attr:`val_accuracy`) is its accuracy on further real files of its seed, held out. What
it says about samples (:func:`score`):

- **class accuracy**: the share of samples of class k the judge calls k (a mirrored L is not an L);
- **mirrored rate**: of the samples of a class a mirror changes, the share the judge calls that class mirrored;
  beside it the data's own rate, the share of real held-out files it calls mirrored (its error);
- **cut rate**: the share of samples whose object touches the frame (:func:`touches_frame`), beside the rate of
  the real files prepared the same way (an object the crop cut touches the frame);
- **empty rate**: the share of samples that show no object at all (:func:`is_empty`); the judge files them under
  some class all the same, so the mirrored rate is also given over the samples that show something.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..data.bench import ASYMMETRIC, CLASSES, check_kind, real_files
from .shapes import MIRRORED, SilhouetteJudge, background_distance, silhouette

#: Seed of the judges' real files: no folder of the bench is written from it.
JUDGE_SEED = 1_000_033
#: A sample's object touches the frame when at least this many of its outermost pixels are foreground
#: (silhouette above one half).
FRAME_PIXELS = 2
#: A sample shows no object when no pixel differs from the border's colour by this much (on [-1, 1] channels;
#: every real object differs by 60 grey levels or more, about 0.47).
EMPTY_CONTRAST = 0.25


def prepare_files(images, image_size: int, crop: str, mode: str = "RGB") -> torch.Tensor:
    """PIL images as the trainer prepares them: brought to ``image_size`` by ``crop`` (``adm``, ``object``),
    in ``mode``, as (N, C, H, W) in [-1, 1]."""
    from ..data.images import resize_to, to_tensor

    return torch.stack([to_tensor(resize_to(img.convert(mode), image_size, crop)) for img in images])


def _shift(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A batch moved by up to 2 pixels (of the judge's 32) each way: where an object sits is not its class."""
    dy, dx = (int(v) for v in torch.randint(-2, 3, (2,), generator=g))
    return torch.roll(x, shifts=(dy, dx), dims=(2, 3))


def touches_frame(images) -> np.ndarray:
    """For each image ``(N, C, H, W)`` in [-1, 1]: does its object touch the frame (an object cut by a crop
    does)? The foreground is the silhouette above one half at the image's own size; the object touches the frame
    when :data:`FRAME_PIXELS` or more of the outermost pixels are foreground."""
    x = torch.as_tensor(images).float()
    fg = silhouette(x)[:, 0] > 0.5
    ring = torch.cat([fg[:, 0, :], fg[:, -1, :], fg[:, 1:-1, 0], fg[:, 1:-1, -1]], dim=1)
    return (ring.sum(dim=1) >= FRAME_PIXELS).numpy()


def is_empty(images) -> np.ndarray:
    """For each image ``(N, C, H, W)`` in [-1, 1]: does it show no object at all (:data:`EMPTY_CONTRAST`)? The
    judge still files such an image under some class."""
    x = torch.as_tensor(images).float()
    return (background_distance(x).amax(dim=(1, 2, 3)) < EMPTY_CONTRAST).numpy()


class BenchJudge(SilhouetteJudge):
    """The judge of one kind of bench folder at one training preparation (``image_size``, ``crop``, ``mode``).

    Real files: ``per_class`` of each class for fitting (with their mirror images), ``val_per_class`` more held
    out. ``classes``: the kind's classes (the trainer's order: sorted folder names), then one ``"<class>
    (mirrored)"`` for each class a mirror changes. Attributes beside the judge interface: ``kind``,
    ``asymmetric`` (those classes), ``mirror_accuracy`` (held-out mirror images of them called mirrored),
    ``real_mirrored_rate`` (held-out real files of them called mirrored), ``real_frame_rate`` (held-out real files
    whose object touches the frame), ``seconds``."""

    def __init__(self, kind: str, image_size: int = 16, crop: str = "object", mode: str = "RGB",
                 per_class: int = 300, val_per_class: int = 150, epochs: int = 12, seed: int = JUDGE_SEED):
        import time

        started = time.perf_counter()
        self.kind, self.image_size, self.crop, self.mode = check_kind(kind), int(image_size), crop, mode
        base = list(CLASSES[kind])
        self.asymmetric = list(ASYMMETRIC[kind])
        classes = base + [c + MIRRORED for c in self.asymmetric]

        def mirror_labels(labels):
            return torch.tensor([len(base) + self.asymmetric.index(base[y]) if base[y] in self.asymmetric else y
                                 for y in labels.tolist()])

        def files(count, start):
            images, labels, _ = real_files(kind, seed, count, start=start)
            return prepare_files(images, image_size, crop, mode), torch.tensor(labels)

        x, y = files(per_class, 0)
        xv, yv = files(val_per_class, per_class)
        train = (torch.cat([x, x.flip(-1)]), torch.cat([y, mirror_labels(y)]))
        self.fit(classes, train, (xv, yv), epochs, seed, augment=_shift)
        asym = torch.tensor([base[c] in self.asymmetric for c in yv.tolist()])
        if asym.any():
            called = self.predict(xv[asym].flip(-1))
            self.mirror_accuracy = float((called == mirror_labels(yv[asym]).numpy()).mean())
            self.real_mirrored_rate = float((self.predict(xv[asym]) >= len(base)).mean())
        else:
            self.mirror_accuracy, self.real_mirrored_rate = float("nan"), 0.0
        self.real_frame_rate = float(touches_frame(xv).mean())
        self.real_empty_rate = float(is_empty(xv).mean())
        self.seconds = time.perf_counter() - started


@functools.lru_cache(maxsize=6)
def judge(kind: str, image_size: int = 16, crop: str = "object", mode: str = "RGB") -> BenchJudge:
    """The fitted judge of ``kind`` at this preparation (fitted once per process)."""
    return BenchJudge(kind, int(image_size), crop, mode)


def score(images, labels, judge: BenchJudge) -> dict:
    """Everything the bench reports about ``images`` sampled for ``labels`` (indices of the kind's classes):
    :func:`dit_core.eval.classwise.score` (class accuracy, per class, Fréchet distance and its floor, the
    ceiling), the mirrored rates per asymmetric class and over them, the frame rate; with the judge's own figures
    on real files beside them."""
    from .classwise import score as classwise_score

    out = classwise_score(images, labels, judge)
    mirrored = judge.mirrored_rate(images, labels)
    asym = np.isin(np.asarray(torch.as_tensor(labels)), [judge.classes.index(c) for c in judge.asymmetric])
    empty = is_empty(images)
    called = out["predicted"] >= len(judge.classes) - len(judge.asymmetric)
    out.update(empty_rate=float(empty.mean()), real_empty_rate=judge.real_empty_rate,
               mirrored_rate_drawn=float(called[asym & ~empty].mean()) if (asym & ~empty).any() else 0.0)
    out.update(mirrored_rate_per_class=mirrored, mirrored_rate=float(called[asym].mean()) if asym.any() else 0.0,
               frame_rate=float(touches_frame(images).mean()), real_mirrored_rate=judge.real_mirrored_rate,
               real_frame_rate=judge.real_frame_rate, mirror_accuracy=judge.mirror_accuracy)
    return out
