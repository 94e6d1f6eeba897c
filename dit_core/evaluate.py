"""How good are the samples? FID, and honest numbers for the digits default.

**FID** (Heusel et al. 2017): fit a Gaussian to the features of each image set and take the Fréchet
(2-Wasserstein) distance between the two Gaussians,

    FID = |mu_1 - mu_2|^2 + Tr(S_1 + S_2 - 2 (S_1 S_2)^(1/2)),

with the features the 2048-wide pool3 layer of the Inception-v3 network ported from TensorFlow for FID
(:class:`InceptionV3`). DiT reports FID-50K: 50,000 samples against the ImageNet training set's statistics
(2.27 for DiT-XL/2 at cfg 1.5). The network's weights are not downloaded here: pass the path of
``pt_inception-2015-12-05-6726825d.pth`` (the pytorch-fid release; see :data:`INCEPTION_HELP`). Our forward
pass follows the same architecture, so numbers are close to, but not bit-identical with, other FID tools;
compare numbers computed by one tool only.

**The digits default** (a laptop): an Inception network trained on ImageNet photos says little about 8x8
digits. Instead, :mod:`dit_core.digits_eval` fits a classifier on the *real* digits, and
:func:`digits_metrics` reports its class accuracy on the samples (does a "3" look like a 3?) and the
Fréchet distance between samples and real digits in that classifier's 10-dimensional score space (do the
samples vary like real digits?), next to the same distance between two real splits, its floor.

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
import torch.nn.functional as F

INCEPTION_FILE = "pt_inception-2015-12-05-6726825d.pth"
INCEPTION_URL = "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/" + INCEPTION_FILE
INCEPTION_HELP = (
    "FID needs the weights of the FID Inception-v3 network, which are not downloaded automatically. On a "
    "machine with internet:\n"
    f"    curl -L -o {INCEPTION_FILE} {INCEPTION_URL}\n"
    "(the TensorFlow FID network ported to PyTorch by pytorch-fid, Apache-2.0, 91 MB), copy the file here and "
    "pass its path: `dit-eval ... --inception PATH` or `inception=PATH`, or set DIT_INCEPTION=PATH. For the "
    "digits default no network is needed: use `dit-eval --digits`."
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


# ----------------------------------------------------------------------------------------------------------
# The Fréchet distance
# ----------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------
# Images in and out
# ----------------------------------------------------------------------------------------------------------


def load_images(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a sample set as ``(uint8 images (N, H, W, C), labels or None)``.

    Accepts the ``.npz`` of :func:`dit_core.sample.save_npz` / the official FID tooling (``arr_0``, optional
    ``labels``), an ``.npy`` array, or a folder of image files (read recursively, sorted by path).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"sample set not found: {path}")
    if path.is_dir():
        from PIL import Image

        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {path}")
        arrays = [np.asarray(Image.open(f).convert("RGB")) for f in files]
        if len({a.shape for a in arrays}) > 1:
            raise ValueError(f"images in {path} have different sizes; resize them to one size first")
        return np.stack(arrays), None
    if path.suffix == ".npy":
        return _check_images(np.load(path), path), None
    if path.suffix == ".npz":
        with np.load(path) as data:
            if "arr_0" not in data:
                raise ValueError(f"{path} holds {sorted(data.files)}, not 'arr_0' images (or 'mu'/'sigma' statistics)")
            labels = np.asarray(data["labels"]) if "labels" in data else None
            return _check_images(data["arr_0"], path), labels
    raise ValueError(f"cannot read {path}: use an .npz with arr_0, an .npy, or a folder of images")


def _check_images(arr: np.ndarray, where) -> np.ndarray:
    if arr.ndim == 3:
        arr = arr[..., None]
    if arr.ndim != 4 or arr.shape[-1] not in (1, 3):
        raise ValueError(f"{where}: images must be uint8 (N, H, W, C) with C 1 or 3, got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"{where}: images must be uint8 in 0..255 (the FID tooling's format), got {arr.dtype}")
    return arr


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


# ----------------------------------------------------------------------------------------------------------
# The FID Inception-v3 (Szegedy et al. 2016, as frozen in TensorFlow's 2015-12-05 graph)
# ----------------------------------------------------------------------------------------------------------


class ConvBN(nn.Module):
    """Convolution without bias, batch norm (eps 1e-3, as in TensorFlow), ReLU."""

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _avg3(x):
    # TensorFlow's average pool ignores the zero padding; count_include_pad=False does the same.
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


class MixedA(nn.Module):
    """35x35 module: 1x1, 5x5, double 3x3 and pooled branches."""

    def __init__(self, cin: int, pool_features: int):
        super().__init__()
        self.branch1x1 = ConvBN(cin, 64, 1)
        self.branch5x5_1 = ConvBN(cin, 48, 1)
        self.branch5x5_2 = ConvBN(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = ConvBN(cin, 64, 1)
        self.branch3x3dbl_2 = ConvBN(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = ConvBN(96, 96, 3, padding=1)
        self.branch_pool = ConvBN(cin, pool_features, 1)

    def forward(self, x):
        return torch.cat([
            self.branch1x1(x),
            self.branch5x5_2(self.branch5x5_1(x)),
            self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
            self.branch_pool(_avg3(x)),
        ], 1)


class ReductionB(nn.Module):
    """35x35 -> 17x17: strided 3x3, strided double 3x3, max pool."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = ConvBN(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = ConvBN(cin, 64, 1)
        self.branch3x3dbl_2 = ConvBN(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = ConvBN(96, 96, 3, stride=2)

    def forward(self, x):
        return torch.cat([
            self.branch3x3(x),
            self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
            F.max_pool2d(x, 3, stride=2),
        ], 1)


class MixedC(nn.Module):
    """17x17 module with factorised 7x7 convolutions (1x7 then 7x1) of width ``c7``."""

    def __init__(self, cin: int, c7: int):
        super().__init__()
        row, col = dict(kernel=(1, 7), padding=(0, 3)), dict(kernel=(7, 1), padding=(3, 0))
        self.branch1x1 = ConvBN(cin, 192, 1)
        self.branch7x7_1 = ConvBN(cin, c7, 1)
        self.branch7x7_2 = ConvBN(c7, c7, **row)
        self.branch7x7_3 = ConvBN(c7, 192, **col)
        self.branch7x7dbl_1 = ConvBN(cin, c7, 1)
        self.branch7x7dbl_2 = ConvBN(c7, c7, **col)
        self.branch7x7dbl_3 = ConvBN(c7, c7, **row)
        self.branch7x7dbl_4 = ConvBN(c7, c7, **col)
        self.branch7x7dbl_5 = ConvBN(c7, 192, **row)
        self.branch_pool = ConvBN(cin, 192, 1)

    def forward(self, x):
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        d = x
        for i in range(1, 6):
            d = getattr(self, f"branch7x7dbl_{i}")(d)
        return torch.cat([self.branch1x1(x), b7, d, self.branch_pool(_avg3(x))], 1)


class ReductionD(nn.Module):
    """17x17 -> 8x8: strided 3x3 after 1x1, strided 3x3 after a 7x7 factorisation, max pool."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3_1 = ConvBN(cin, 192, 1)
        self.branch3x3_2 = ConvBN(192, 320, 3, stride=2)
        self.branch7x7x3_1 = ConvBN(cin, 192, 1)
        self.branch7x7x3_2 = ConvBN(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = ConvBN(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = ConvBN(192, 192, 3, stride=2)

    def forward(self, x):
        b7 = x
        for i in range(1, 5):
            b7 = getattr(self, f"branch7x7x3_{i}")(b7)
        return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), b7, F.max_pool2d(x, 3, stride=2)], 1)


class MixedE(nn.Module):
    """8x8 module with split 1x3 / 3x1 outputs. ``max_pool``: the last module of the TensorFlow graph pools
    its fourth branch with a max, not an average (a quirk FID keeps)."""

    def __init__(self, cin: int, max_pool: bool):
        super().__init__()
        self.max_pool = max_pool
        self.branch1x1 = ConvBN(cin, 320, 1)
        self.branch3x3_1 = ConvBN(cin, 384, 1)
        self.branch3x3_2a = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = ConvBN(cin, 448, 1)
        self.branch3x3dbl_2 = ConvBN(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = ConvBN(cin, 192, 1)

    def forward(self, x):
        b3 = self.branch3x3_1(x)
        d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pooled = F.max_pool2d(x, 3, stride=1, padding=1) if self.max_pool else _avg3(x)
        return torch.cat([
            self.branch1x1(x),
            torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1),
            torch.cat([self.branch3x3dbl_3a(d), self.branch3x3dbl_3b(d)], 1),
            self.branch_pool(pooled),
        ], 1)


class InceptionV3(nn.Module):
    """Inception-v3 up to its 2048-wide global average pool ("pool3"), the FID feature layer.

    Module names follow the usual PyTorch port, so the pytorch-fid weights file loads as it is. The input is
    ``(N, 3, H, W)`` in [0, 1]; it is resized to 299x299 (bilinear) and mapped to [-1, 1] inside.
    """

    def __init__(self):
        super().__init__()
        self.Conv2d_1a_3x3 = ConvBN(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = ConvBN(32, 32, 3)
        self.Conv2d_2b_3x3 = ConvBN(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = ConvBN(64, 80, 1)
        self.Conv2d_4a_3x3 = ConvBN(80, 192, 3)
        self.Mixed_5b = MixedA(192, 32)
        self.Mixed_5c = MixedA(256, 64)
        self.Mixed_5d = MixedA(288, 64)
        self.Mixed_6a = ReductionB(288)
        self.Mixed_6b = MixedC(768, 128)
        self.Mixed_6c = MixedC(768, 160)
        self.Mixed_6d = MixedC(768, 160)
        self.Mixed_6e = MixedC(768, 192)
        self.Mixed_7a = ReductionD(768)
        self.Mixed_7b = MixedE(1280, max_pool=False)
        self.Mixed_7c = MixedE(2048, max_pool=True)
        self.fc = nn.Linear(2048, 1008)  # the 1008-way logits of the TF graph; unused for FID

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
        x = 2 * x - 1
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, 3, stride=2)
        for name in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b", "7c"):
            x = getattr(self, f"Mixed_{name}")(x)
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


def load_inception(path: str | os.PathLike | None = None, device: str | torch.device = "cpu") -> InceptionV3:
    """The FID Inception-v3 with weights from a local file (``path``, else ``$DIT_INCEPTION``), in eval mode."""
    path = path or os.environ.get("DIT_INCEPTION")
    if not path:
        raise FileNotFoundError("no Inception weights given. " + INCEPTION_HELP)
    path = Path(path).expanduser()
    if path.is_dir() and (path / INCEPTION_FILE).is_file():
        path = path / INCEPTION_FILE
    if not path.is_file():
        raise FileNotFoundError(f"Inception weights not found at {path}. " + INCEPTION_HELP)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - truncated downloads, HTML error pages, pickles with code
        raise ValueError(f"cannot read {path} as a weights file ({type(err).__name__}: {err}). " + INCEPTION_HELP) from None
    model = InceptionV3()
    state = {k: v for k, v in state.items() if not k.startswith("AuxLogits.") and not k.endswith("num_batches_tracked")}
    expected = {k for k in model.state_dict() if not k.endswith("num_batches_tracked")}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{path} is not the FID Inception-v3 weights file (missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]}). " + INCEPTION_HELP)
    model.load_state_dict(state, strict=False)
    return model.to(device).eval().requires_grad_(False)


@torch.no_grad()
def inception_features(images: np.ndarray, model: nn.Module, batch_size: int = 50, device=None,
                       progress: bool = False) -> np.ndarray:
    """Pool3 features ``(N, 2048)`` of uint8 images ``(N, H, W, C)`` (grey images are repeated to RGB)."""
    images = _check_images(np.asarray(images), "images")
    device = device or next(model.parameters()).device
    starts = range(0, len(images), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="Inception features")
    out = []
    for s in starts:
        x = torch.from_numpy(images[s : s + batch_size]).to(device).permute(0, 3, 1, 2).float() / 255.0
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        out.append(model(x).double().cpu().numpy())
    return np.concatenate(out)


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


# ----------------------------------------------------------------------------------------------------------
# The digits default
# ----------------------------------------------------------------------------------------------------------


def digits_metrics(images, labels=None, reference: str = "train") -> dict:
    """Class accuracy and classifier-space Fréchet distance of digit samples.

    ``images``: ``(N, C, H, W)`` floats in [-1, 1] or uint8 ``(N, H, W, C)``; ``labels``: the classes they were
    sampled for (None skips the accuracy). The Fréchet distance compares the samples with the real digits of
    ``reference`` ("train", "val" or "all") in the 10-dimensional decision space of
    :class:`dit_core.digits_eval.DigitsClassifier`; ``real_floor`` is the same distance from the real
    validation split to the real training split: what a perfect sampler would get with as many samples (a
    fixed random subset of the split when the samples are fewer; the distance of a small set is biased upwards).
    """
    from .digits_eval import classifier, load_real_digits

    x = to_float_images(images)
    clf = classifier()
    feats = clf.features(x)
    ref_images, _ = load_real_digits(reference)
    ref_feats = clf.features(ref_images)
    out = {
        "frechet_distance": frechet_distance_features(feats, ref_feats),
        "num_samples": len(x),
        "classifier_val_accuracy": clf.val_accuracy,
    }
    if reference == "train":
        val = load_real_digits("val")[0]
        if len(x) < len(val):
            val = val[np.random.default_rng(0).choice(len(val), max(len(x), 2), replace=False)]
        out["real_floor"] = frechet_distance_features(clf.features(val), ref_feats)
    if labels is not None:
        labels = np.asarray(torch.as_tensor(labels).cpu()).reshape(-1)
        if len(labels) != len(x):
            raise ValueError(f"{len(x)} images but {len(labels)} labels")
        predicted = clf.predict(x)
        out["class_accuracy"] = float((predicted == labels).mean())
        out["per_class_accuracy"] = {int(c): float((predicted[labels == c] == c).mean()) for c in np.unique(labels)}
    return out


def to_float_images(images) -> torch.Tensor:
    """uint8 ``(N, H, W, C)`` arrays become float ``(N, C, H, W)`` in [-1, 1]; float tensors pass through."""
    if isinstance(images, np.ndarray) and images.dtype == np.uint8:
        arr = _check_images(images, "images")
        return torch.from_numpy(arr).permute(0, 3, 1, 2).float() / 127.5 - 1
    x = torch.as_tensor(images).float()
    if x.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W) floats or (N, H, W, C) uint8, got shape {tuple(x.shape)}")
    return x
