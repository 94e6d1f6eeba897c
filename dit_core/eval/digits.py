"""Honest numbers for the digits default: does a sample of class 3 look like a 3, and do the samples vary
like real digits?

An Inception network trained on ImageNet photos says little about 8x8 digits.

A support-vector classifier (RBF kernel) is fitted on the *real* training split of scikit-learn's digits
(the same split and pixel values :func:`dit_core.data.export_digits` writes) and never sees a generated
image. :func:`class_accuracy` is the fraction of generated images it assigns to the class they were
sampled for. Its own accuracy on the real validation split (:attr:`DigitsClassifier.val_accuracy`, about
98.6%) is the ceiling of that number.

Images of any size are compared at the digits' native 8x8: area-averaged down (a 16x16 sample becomes the
mean of its 2x2 blocks), colour averaged to grey. The fit is deterministic (no random state is involved)
and takes a fraction of a second, so it is simply cached per process.

:func:`digits_metrics` also reports the Fréchet distance between samples and real digits in the classifier's
10-dimensional score space (:mod:`.fid`'s distance, in a feature space fitted to digits), next to the same
distance between two real splits, its floor.

``python -m dit_core.eval.digits RUN_OR_CHECKPOINT`` samples a trained digits model and prints its class
accuracy (see :func:`main`).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

from .fid import distance_to_real, sample_labels
from .samples import to_float_images


def load_real_digits(split: str = "train", val_fraction: float = 0.2, seed: int = 0):
    """The real digits as ``(images, labels)``: images ``(N, 1, 8, 8)`` float32 in [-1, 1] (grey 0..16 scaled
    to 0..255 and normalised as the trainer sees them), for ``split`` "train", "val" or "all"."""
    from sklearn.datasets import load_digits

    from ..data.digits import digits_split

    d = load_digits()
    pixels = np.rint(d.images * (255.0 / 16.0)).clip(0, 255) / 127.5 - 1.0
    labels = d.target.astype(np.int64)
    is_val = digits_split(labels, val_fraction, seed)
    keep = {"train": ~is_val, "val": is_val, "all": np.ones_like(is_val)}[split]
    return torch.tensor(pixels[keep], dtype=torch.float32)[:, None], torch.tensor(labels[keep])


def to_8x8(images: torch.Tensor) -> np.ndarray:
    """``(N, C, H, W)`` images in [-1, 1] to ``(N, 64)`` grey 8x8 features, as the classifier sees them."""
    x = torch.as_tensor(images).detach().float().cpu()
    if x.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(x.shape)}")
    x = x.mean(dim=1, keepdim=True)
    if x.shape[-2:] != (8, 8):
        if x.shape[-1] % 8 == 0 and x.shape[-2] % 8 == 0:
            x = F.adaptive_avg_pool2d(x, 8)
        else:
            x = F.interpolate(x, size=(8, 8), mode="bilinear", antialias=True, align_corners=False)
    return x.reshape(len(x), 64).numpy()


class DigitsClassifier:
    """An RBF support-vector classifier of 8x8 digits, fitted on the real training split."""

    def __init__(self, val_fraction: float = 0.2, seed: int = 0):
        from sklearn.svm import SVC

        x, y = load_real_digits("train", val_fraction, seed)
        self.svc = SVC(C=10.0, gamma="scale").fit(to_8x8(x), y.numpy())
        xv, yv = load_real_digits("val", val_fraction, seed)
        self.val_accuracy = float((self.svc.predict(to_8x8(xv)) == yv.numpy()).mean())
        self.num_train, self.num_val = len(y), len(yv)

    def predict(self, images: torch.Tensor) -> np.ndarray:
        """Predicted digit of each image (N, C, H, W) in [-1, 1]."""
        return self.svc.predict(to_8x8(images))

    def features(self, images: torch.Tensor) -> np.ndarray:
        """10 class scores per image (one-vs-rest decision values): a feature space fitted to real digits."""
        return self.svc.decision_function(to_8x8(images))

    def accuracy(self, images: torch.Tensor, labels) -> float:
        labels = np.asarray(torch.as_tensor(labels).cpu())
        if len(labels) != len(images):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        return float((self.predict(images) == labels).mean())


@functools.lru_cache(maxsize=4)
def classifier(val_fraction: float = 0.2, seed: int = 0) -> DigitsClassifier:
    """The fitted classifier (fitted once per process)."""
    return DigitsClassifier(val_fraction, seed)


def class_accuracy(images: torch.Tensor, labels) -> float:
    """Fraction of ``images`` that the real-digits classifier assigns to their ``labels``."""
    return classifier().accuracy(images, labels)


def evaluate(model, diffusion, per_class: int = 20, cfg_scale: float = 1.0, sampler: str = "ddim",
             steps: int | None = 50, seed: int = 0, device=None, amp: str = "fp32", batch_size: int = 100,
             progress: bool = False) -> dict:
    """Sample ``per_class`` images of each digit from ``model`` and score them with the classifier.

    Returns ``accuracy``, ``per_class`` (accuracy of each digit), ``classifier_val_accuracy``, the
    ``images`` and their ``labels``.
    """
    from ..sample import generate

    if getattr(model, "num_classes", 0) != 10:
        raise ValueError(f"the digits classifier needs a 10-class model, got num_classes={model.num_classes}")
    labels = torch.arange(10).repeat_interleave(per_class)
    images = generate(model, diffusion, labels, cfg_scale=cfg_scale, sampler=sampler, steps=steps, seed=seed,
                      device=device, amp=amp, batch_size=batch_size, progress=progress)
    clf = classifier()
    predicted = clf.predict(images)
    hits = predicted == labels.numpy()
    return {
        "accuracy": float(hits.mean()),
        "per_class": [float(hits[labels.numpy() == c].mean()) for c in range(10)],
        "classifier_val_accuracy": clf.val_accuracy,
        "images": images,
        "labels": labels,
        "predicted": predicted,
    }


def digits_metrics(images, labels=None, reference: str = "train") -> dict:
    """Class accuracy and classifier-space Fréchet distance of digit samples.

    ``images``: ``(N, C, H, W)`` floats in [-1, 1] or uint8 ``(N, H, W, C)``; ``labels``: the classes they were
    sampled for (None skips the accuracy). The Fréchet distance compares the samples with the real digits of
    ``reference`` ("train", "val" or "all") in the 10-dimensional decision space of
    :class:`DigitsClassifier`; ``real_floor`` is the same distance from the real
    validation split to the real training split: what a perfect sampler would get with as many samples (a
    fixed random subset of the split when the samples are fewer; the distance of a small set is biased upwards).
    """
    x = to_float_images(images)
    clf = classifier()
    out = distance_to_real(clf.features, x, load_real_digits(reference)[0],
                           load_real_digits("val")[0] if reference == "train" else None)
    out = {"classifier_val_accuracy": clf.val_accuracy, **out}
    if labels is not None:
        labels = sample_labels(labels, len(x))
        predicted = clf.predict(x)
        out["class_accuracy"] = float((predicted == labels).mean())
        out["per_class_accuracy"] = {int(c): float((predicted[labels == c] == c).mean()) for c in np.unique(labels)}
    return out


def main(argv=None) -> dict:
    """``python -m dit_core.eval.digits RUN_DIR_OR_CKPT [--per-class 20] [--cfg-scale 1.0] ...``"""
    from pathlib import Path

    from ..checkpoint import load_dit
    from ..diffusion import process_of

    p = argparse.ArgumentParser(prog="python -m dit_core.eval.digits", description=main.__doc__)
    p.add_argument("checkpoint", help="a run folder (uses checkpoints/last.pt) or a checkpoint file")
    p.add_argument("--per-class", type=int, default=20)
    p.add_argument("--cfg-scale", type=float, default=1.0)
    p.add_argument("--sampler", default="ddim", choices=["ddim", "ddpm"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--amp", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--grid", default=None, help="also save the samples as a labelled PNG grid")
    args = p.parse_args(argv)
    path = Path(args.checkpoint)
    if path.is_dir():
        path = path / "checkpoints" / "last.pt"
    model = load_dit(path)
    ckpt_cfg = torch.load(path, map_location="cpu", weights_only=True).get("config", {})
    diffusion = process_of(ckpt_cfg, model.learn_sigma)
    result = evaluate(model, diffusion, per_class=args.per_class, cfg_scale=args.cfg_scale, sampler=args.sampler,
                      steps=args.steps, seed=args.seed, amp=args.amp, progress=True)
    if args.grid:
        from ..sample import save_grid

        save_grid(result["images"], args.grid, nrow=args.per_class, labels=result["predicted"].tolist())
    summary = {k: result[k] for k in ("accuracy", "per_class", "classifier_val_accuracy")}
    summary.update(checkpoint=str(path), per_class_samples=args.per_class, cfg_scale=args.cfg_scale,
                   sampler=args.sampler, steps=args.steps, seed=args.seed)
    json.dump(summary, sys.stdout, indent=2)
    print()
    return summary


if __name__ == "__main__":
    main()
