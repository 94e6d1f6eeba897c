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
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from .inception import inception_features, load_inception
from .samples import load_images

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


def load_statistics(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray] | None:
    """``(mu, sigma)`` from an ``.npz`` holding them (ours or the ADM reference batches), else None."""
    path = Path(path)
    if path.suffix != ".npz" or not path.is_file():
        return None
    with np.load(path) as data:
        if "mu" in data and "sigma" in data:
            return np.asarray(data["mu"], np.float64), np.asarray(data["sigma"], np.float64)
    return None


def save_statistics(path: str | os.PathLike, mu: np.ndarray, sigma: np.ndarray) -> Path:
    """Write ``mu``/``sigma`` to ``path`` (.npz) for reuse as a reference."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, mu=mu, sigma=sigma)
    return path


def fid(samples, reference, inception: str | os.PathLike | nn.Module | None = None, batch_size: int = 50,
        device: str | torch.device = "cpu", progress: bool = False, save_reference_stats: str | None = None) -> dict:
    """FID between two sample sets (paths for :func:`load_images`, or uint8 arrays), or between a set and
    reference statistics (an ``.npz`` with ``mu``/``sigma``, e.g. the ADM ImageNet reference batch).

    Returns ``fid``, ``num_samples``, ``num_reference``.
    """
    model = inception if isinstance(inception, nn.Module) else load_inception(inception, device)

    def stats(source):
        if isinstance(source, (str, os.PathLike)):
            saved = load_statistics(source)
            if saved is not None:
                return saved, None
            source = load_images(source)[0]
        feats = inception_features(source, model, batch_size, device, progress)
        return feature_statistics(feats), len(feats)

    (mu1, s1), n1 = stats(samples)
    (mu2, s2), n2 = stats(reference)
    if save_reference_stats:
        save_statistics(save_reference_stats, mu2, s2)
    return {"fid": frechet_distance(mu1, s1, mu2, s2), "num_samples": n1, "num_reference": n2}
