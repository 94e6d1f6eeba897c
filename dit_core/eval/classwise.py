"""One code path for "does a sample of class k look like class k?": sample per class, classify, Fréchet distance.

An Inception network trained on ImageNet photos says little about 8x8 digits or 32-px shapes. For the
small datasets of the CPU track, each dataset brings a *judge* instead: a classifier fitted on real images
of that dataset only (it never sees a generated image). Two numbers follow from it:

- **class accuracy**: the share of samples drawn for class k that the judge assigns to class k. Its
  ceiling is the judge's own accuracy on held-out real images (``classifier_val_accuracy``);
- **Fréchet distance in the judge's feature space** (the FID recipe with a dataset-specific network): fit a
  Gaussian to the features of the samples and one to the features of real images, and take the Fréchet
  distance between them. ``real_floor`` is the same distance from held-out real images (as many as the
  samples, since the distance of a small set is biased upwards) to the reference: what a perfect sampler
  would score.

A judge is any object with:

- ``classes``: the class names in the judge's label order (a model's class ``i`` is mapped to the judge by
  its name, so a run whose folders sort differently is still scored right);
- ``val_accuracy``: accuracy on held-out real images;
- ``predict(images) -> (N,)`` labels and ``features(images) -> (N, D)``, for images ``(N, C, H, W)`` in
  [-1, 1];
- ``real_images(split) -> (images, labels)`` for ``split`` "train" (the reference of the distance) and
  "val" (held out: the floor);
- optionally ``is_clean(images) -> (N,)`` booleans: whether each image passes a test of realism that the
  classifier cannot make (it must file every image under some class). With it, :func:`score` adds the
  **clean accuracy**: the share of samples that are assigned to their class *and* pass the test.

:class:`dit_core.eval.shapes.ShapesClassifier` is one; :func:`digits_judge` wraps the digits' classifier.
"""

from __future__ import annotations

import numpy as np
import torch

from .fid import distance_to_real, sample_labels
from .samples import to_float_images


def map_labels(model_classes, judge_classes) -> list[int]:
    """For each of a model's class names, the judge's label of the same name (a clear error if one is
    missing: the judge cannot score a class it was not trained on)."""
    judge = [str(c) for c in judge_classes]
    missing = [str(c) for c in model_classes if str(c) not in judge]
    if missing:
        raise ValueError(f"the classifier knows the classes {judge}, not {missing}")
    return [judge.index(str(c)) for c in model_classes]


def score(images, labels, judge, reference: str = "train") -> dict:
    """Class accuracy and Fréchet distance of ``images`` (labels in the judge's label space).

    ``images``: ``(N, C, H, W)`` floats in [-1, 1] or uint8 ``(N, H, W, C)`` (as read from an npz);
    ``labels``: the class each was sampled for, or None to skip the accuracy.
    """
    x = to_float_images(images)
    out = distance_to_real(judge.features, x, judge.real_images(reference)[0],
                           judge.real_images("val")[0] if reference == "train" else None)
    out = {"classifier_val_accuracy": float(judge.val_accuracy), **out}
    if labels is not None:
        labels = sample_labels(labels, len(x))
        predicted = np.asarray(judge.predict(x))

        def per_class(right):
            return {str(judge.classes[int(c)]): float(right[labels == c].mean()) for c in np.unique(labels)}

        right = predicted == labels
        out["class_accuracy"], out["per_class_accuracy"] = float(right.mean()), per_class(right)
        out["predicted"] = predicted
        if hasattr(judge, "is_clean"):
            right &= np.asarray(judge.is_clean(x), dtype=bool)
            out["clean_accuracy"], out["per_class_clean_accuracy"] = float(right.mean()), per_class(right)
    return out


def sample_and_score(model, diffusion, judge, class_names=None, per_class: int = 20, cfg_scale: float = 1.0,
                     sampler: str = "ddim", steps: int | None = 50, seed: int = 0,
                     device=None, amp: str = "fp32", batch_size: int = 100, progress: bool = False,
                     guidance_interval=None) -> dict:
    """Sample ``per_class`` images of every class of ``model`` and :func:`score` them.

    ``class_names``: the model's class names in its label order (a run's ``classes``; default: the judge's
    classes, i.e. the model was trained on the judge's folders in the same order). Returns the scores plus
    ``images``, ``labels`` (the model's labels) and ``judge_labels``.
    """
    from ..sample import generate

    num_classes = getattr(model, "num_classes", 0)
    names = list(class_names) if class_names is not None else list(judge.classes)[:num_classes]
    if len(names) != num_classes:
        raise ValueError(f"the model has {num_classes} classes but {len(names)} class names were given")
    to_judge = map_labels(names, judge.classes)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    images = generate(model, diffusion, labels, cfg_scale=cfg_scale, sampler=sampler, steps=steps, seed=seed,
                      device=device, amp=amp, batch_size=batch_size, progress=progress,
                      guidance_interval=guidance_interval)
    judge_labels = torch.tensor([to_judge[int(c)] for c in labels])
    out = score(images, judge_labels, judge)
    out.update(images=images, labels=labels, judge_labels=judge_labels, class_names=[str(n) for n in names],
               per_class_samples=per_class, cfg_scale=cfg_scale, sampler=sampler,
               steps=steps, seed=seed, guidance_interval=guidance_interval)
    return out


class _DigitsJudge:
    """The digits' support-vector classifier seen through the judge interface (classes "0".."9")."""

    classes = [str(d) for d in range(10)]

    def __init__(self):
        from . import digits

        self._clf = digits.classifier()
        self._load = digits.load_real_digits
        self.val_accuracy = self._clf.val_accuracy

    def predict(self, images):
        return self._clf.predict(images)

    def features(self, images):
        return self._clf.features(images)

    def real_images(self, split: str):
        return self._load(split)




def digits_judge() -> _DigitsJudge:
    """The digits' classifier as a judge, so the digits and the shapes are scored by the same code."""
    return _DigitsJudge()
