"""The FID Inception-v3 (Szegedy et al. 2016, as frozen in TensorFlow's 2015-12-05 graph) and its features.

FID compares the 2048-wide pool3 features of this network. Its weights are not downloaded here: pass the path
of ``pt_inception-2015-12-05-6726825d.pth`` (the pytorch-fid release; see :data:`INCEPTION_HELP`). The forward
pass follows the same architecture, so numbers are close to, but not bit-identical with, other FID tools;
compare numbers computed by one tool only.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .samples import check_images

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
    images = check_images(np.asarray(images), "images")
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
