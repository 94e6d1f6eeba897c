"""How good are the samples? FID (Heusel et al. 2017), the Fréchet distance of two feature distributions.

Fit a Gaussian to the features of each image set and take the Fréchet (2-Wasserstein) distance between the two
Gaussians,

    FID = |mu_1 - mu_2|^2 + Tr(S_1 + S_2 - 2 (S_1 S_2)^(1/2)),

with the features the 2048-wide pool3 layer of the Inception-v3 network ported from TensorFlow for FID
(:mod:`.inception`). DiT reports FID-50K: 50,000 samples against the ImageNet training set's statistics (2.27
for DiT-XL/2 at cfg 1.5). For the digits default, :mod:`.digits` measures the same distance in the space of a
classifier fitted to real digits.

:func:`frechet_distance` computes the matrix square root through eigen-decompositions of symmetric matrices
(stable for the rank-deficient covariances of small sample sets); ``method="sqrtm"`` uses
``scipy.linalg.sqrtm`` instead, the way the original TTUR code does.

**Which network made the statistics.** A reference ``.npz`` may hold images (``arr_0``), statistics
(``mu``/``sigma``), or both, like ADM's ``VIRTUAL_imagenet256_labeled.npz`` (10,000 images, and ``mu``/``sigma``
over the whole ImageNet training set computed with TensorFlow's Inception graph). Statistics from another
network do not measure the same features as ours, so by default (``reference_stats="auto"``) a reference with
images gets its statistics from those images with the same network as the samples; stored statistics are used
only when there are no images, or when asked (``"stored"``), and the result says so in its ``notes``. Statistics
that :func:`save_statistics` wrote carry a ``source`` naming this network, and are used without a note.

Features are computed in chunks straight from the ``.npz`` (:func:`dit_core.eval.samples.iter_images`) and
folded into running statistics (:class:`RunningStatistics`), so 50,000 samples never sit in memory.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from .inception import inception_features, load_inception
from .samples import iter_images

#: What :func:`save_statistics` records as the ``source`` of the statistics it writes.
STATS_SOURCE = "dit_core: pool3 of the FID Inception-v3 (PyTorch port of TF's 2015-12-05 graph)"
REFERENCE_STATS = ("auto", "images", "stored")

def feature_statistics(features) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (unbiased, float64) of ``features`` ``(N, D)``."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"need at least 2 feature vectors of shape (N, D), got shape {f.shape}")
    return f.mean(axis=0), np.cov(f, rowvar=False).reshape(f.shape[1], f.shape[1])


def _psd_sqrt(s: np.ndarray) -> np.ndarray:
    vals, vecs = np.linalg.eigh((s + s.T) / 2)
    return (vecs * np.sqrt(np.clip(vals, 0, None))) @ vecs.T


def frechet_distance(mu1, sigma1, mu2, sigma2, method: str = "eigh") -> float:
    """Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2).

    ``Tr (S1 S2)^(1/2)`` equals ``Tr (A S2 A)^(1/2)`` with ``A = S1^(1/2)``; ``A S2 A`` is symmetric positive
    semi-definite, so its square root's trace is the sum of the square roots of its eigenvalues
    (``method="eigh"``, the default). ``method="sqrtm"`` takes ``scipy.linalg.sqrtm(S1 @ S2)`` and drops the
    imaginary round-off, as the reference implementation does.
    """
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    s1, s2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != (len(mu1), len(mu1)):
        raise ValueError(
            f"statistics do not match: means {mu1.shape} vs {mu2.shape}, covariances {s1.shape} vs {s2.shape} "
            "(were they computed with the same feature extractor?)"
        )
    if method == "eigh":
        a = _psd_sqrt(s1)
        m = a @ s2 @ a
        tr_covmean = float(np.sqrt(np.clip(np.linalg.eigvalsh((m + m.T) / 2), 0, None)).sum())
    elif method == "sqrtm":
        from scipy import linalg

        covmean = linalg.sqrtm(s1 @ s2)
        if not np.isfinite(covmean).all():  # singular product: nudge both diagonals, as TTUR does
            offset = np.eye(len(s1)) * 1e-6
            covmean = linalg.sqrtm((s1 + offset) @ (s2 + offset))
        tr_covmean = float(np.trace(np.real(covmean)))
    else:
        raise ValueError(f"method must be 'eigh' or 'sqrtm', got {method!r}")
    diff = mu1 - mu2
    return float(max(diff @ diff + np.trace(s1) + np.trace(s2) - 2 * tr_covmean, 0.0))


def frechet_distance_features(features1, features2, method: str = "eigh") -> float:
    """Fréchet distance between the Gaussians fitted to two feature sets ``(N1, D)`` and ``(N2, D)``."""
    return frechet_distance(*feature_statistics(features1), *feature_statistics(features2), method=method)


class RunningStatistics:
    """Mean and covariance of features that arrive in chunks (Chan et al.'s pairwise update, float64): the
    same result as :func:`feature_statistics` of all of them, holding only a D x D matrix."""

    def __init__(self):
        self.n, self.mean, self.scatter = 0, None, None

    def add(self, features) -> None:
        f = np.asarray(features, dtype=np.float64)
        if len(f) == 0:
            return
        mean = f.mean(axis=0)
        centred = f - mean
        scatter = centred.T @ centred
        if self.n == 0:
            self.n, self.mean, self.scatter = len(f), mean, scatter
            return
        n = self.n + len(f)
        delta = mean - self.mean
        self.scatter = self.scatter + scatter + np.outer(delta, delta) * (self.n * len(f) / n)
        self.mean = self.mean + delta * (len(f) / n)
        self.n = n

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self.n < 2:
            raise ValueError(f"need at least 2 feature vectors, got {self.n}")
        return self.mean, self.scatter / (self.n - 1)


def distance_to_real(features, samples, reference, validation=None) -> dict:
    """The Fréchet distance of ``samples`` to the real ``reference`` images in a classifier's feature space
    (``features``: images -> ``(N, D)``; the digits' and the shapes' scores), and, given real ``validation``
    images, ``real_floor``: their distance to the same reference with as many images as the samples (a fixed
    random subset when the samples are fewer; the distance of a small set is biased upwards), what a perfect
    sampler would get."""
    ref = features(reference)
    out = {"frechet_distance": frechet_distance_features(features(samples), ref), "num_samples": len(samples)}
    if validation is not None:
        if len(samples) < len(validation):
            pick = np.random.default_rng(0).choice(len(validation), max(len(samples), 2), replace=False)
            validation = validation[pick]
        out["real_floor"] = frechet_distance_features(features(validation), ref)
    return out


def sample_labels(labels, count: int) -> np.ndarray:
    """The class each of ``count`` samples was drawn for, as a flat array (a clear error for another count)."""
    labels = np.asarray(torch.as_tensor(labels).cpu()).reshape(-1)
    if len(labels) != count:
        raise ValueError(f"{count} images but {len(labels)} labels")
    return labels


def load_statistics(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray] | None:
    """``(mu, sigma)`` from an ``.npz`` holding them (ours or the ADM reference batches), else None."""
    path = Path(path)
    if path.suffix != ".npz" or not path.is_file():
        return None
    with np.load(path) as data:
        if "mu" in data and "sigma" in data:
            return np.asarray(data["mu"], np.float64), np.asarray(data["sigma"], np.float64)
    return None


def statistics_source(path: str | os.PathLike) -> str | None:
    """The ``source`` recorded with the statistics of an ``.npz`` (None for files from other tools, such as the
    ADM reference batches, whose statistics come from TensorFlow's Inception graph)."""
    with np.load(path) as data:
        return str(data["source"]) if "source" in data else None


def has_images(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an image set: an ``.npz`` with ``arr_0``, an ``.npy``, or a folder."""
    path = Path(path)
    if path.suffix == ".npz" and path.is_file():
        with np.load(path) as data:
            return "arr_0" in data.files
    return path.exists()


def save_statistics(path: str | os.PathLike, mu: np.ndarray, sigma: np.ndarray, num_images: int | None = None) -> Path:
    """Write ``mu``/``sigma`` to ``path`` (.npz) for reuse as a reference, with the ``source`` network."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {"num_images": np.int64(num_images)} if num_images is not None else {}
    np.savez(path, mu=mu, sigma=sigma, source=np.str_(STATS_SOURCE), **extra)
    return path


def image_statistics(images, model: nn.Module, batch_size: int = 50, device=None, progress: bool = False,
                     chunk: int = 1000) -> tuple[np.ndarray, np.ndarray, int]:
    """``(mu, sigma, n)`` of the Inception features of a sample set (a path for :func:`iter_images`, or a uint8
    array), computed ``chunk`` images at a time."""
    if isinstance(images, (str, os.PathLike)):
        chunks = iter_images(images, chunk)
    else:
        arr = np.asarray(images)
        chunks = (arr[s : s + chunk] for s in range(0, len(arr), chunk))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc="Inception features", unit="img")
    stats = RunningStatistics()
    try:
        for part in chunks:
            stats.add(inception_features(part, model, batch_size, device))
            if bar is not None:
                bar.update(len(part))
    finally:
        if bar is not None:
            bar.close()
    mu, sigma = stats.result()
    return mu, sigma, stats.n


def fid(samples, reference, inception: str | os.PathLike | nn.Module | None = None, batch_size: int = 50,
        device: str | torch.device = "cpu", progress: bool = False, save_reference_stats: str | None = None,
        reference_stats: str = "auto") -> dict:
    """FID between two sample sets (paths for :func:`iter_images`, or uint8 arrays), or between a set and
    reference statistics (an ``.npz`` with ``mu``/``sigma``, e.g. the ADM ImageNet reference batch).

    ``reference_stats``: ``"auto"`` computes the reference's statistics from its images with the same network
    as the samples whenever it has images, and uses stored ``mu``/``sigma`` only when it has none; ``"images"``
    insists on images; ``"stored"`` uses the stored statistics even when there are images (to compare with
    numbers computed against them, such as ADM's). Returns ``fid``, ``num_samples``, ``num_reference`` (None for
    stored statistics), ``reference_statistics`` ("images" or "stored") and ``notes`` (what to know about the
    number: statistics from another network, unused stored statistics).
    """
    if reference_stats not in REFERENCE_STATS:
        raise ValueError(f"reference_stats must be one of {', '.join(REFERENCE_STATS)}, got {reference_stats!r}")
    model = inception if isinstance(inception, nn.Module) else load_inception(inception, device)
    notes: list[str] = []

    def plan(source, is_reference: bool):
        """The stored statistics to use for ``source``, or None to compute them from its images."""
        if not isinstance(source, (str, os.PathLike)):
            return None
        saved = load_statistics(source)
        images = has_images(source) if saved is not None else True
        use_saved = saved is not None and (not images or not is_reference or reference_stats == "stored")
        if is_reference and reference_stats == "images" and not images:
            raise ValueError(f"{source} holds statistics (mu/sigma) but no images (arr_0) to compute them from; "
                             "pass --reference-stats auto or stored to use its statistics")
        if is_reference and reference_stats == "stored" and saved is None:
            raise ValueError(f"{source} holds no stored statistics (mu/sigma); use --reference-stats auto")
        if saved is not None:
            notes.extend(_note_on_stored(source, used=use_saved))
        return saved if use_saved else None

    def stats(source, saved):
        if saved is not None:
            return saved, None
        mu, sigma, n = image_statistics(source, model, batch_size, device, progress)
        return (mu, sigma), n

    saved1, saved2 = plan(samples, False), plan(reference, True)  # bad arguments fail before any computing
    (mu1, s1), n1 = stats(samples, saved1)
    (mu2, s2), n2 = stats(reference, saved2)
    if save_reference_stats:
        save_statistics(save_reference_stats, mu2, s2, n2)
    return {"fid": frechet_distance(mu1, s1, mu2, s2), "num_samples": n1, "num_reference": n2,
            "reference_statistics": "stored" if n2 is None else "images", "notes": notes}


def _note_on_stored(path, used: bool) -> list[str]:
    source = statistics_source(path)
    if source == STATS_SOURCE:
        return []
    who = (f"by {source}" if source else "by another Inception network (no source is recorded; ADM's reference "
           "batches such as VIRTUAL_imagenet256_labeled.npz hold statistics of TensorFlow's Inception graph over "
           "the whole ImageNet training set)")
    if used:
        return [f"the statistics (mu/sigma) stored in {path} were computed {who}, not by this PyTorch port: this "
                "FID mixes the features of two Inception implementations (close, not identical), so compare it "
                "only with numbers computed the same way"]
    return [f"{path} also stores statistics (mu/sigma), computed {who}; they were not used: the reference's "
            "statistics were computed from its images with the same network as the samples "
            "(--reference-stats stored uses the stored ones, as ADM's evaluator does)"]
