"""Pretrained encoders ("teachers") whose features representation alignment pulls a DiT's hidden tokens towards.

A teacher maps images ``(N, C, H, W)`` in [-1, 1] to a feature map ``(N, D, h, w)`` (:meth:`feature_map`);
:func:`token_features` pools it to the DiT's token grid, one ``D``-vector per token.

* **DINOv2** (Oquab et al. 2023), REPA's teacher: the ViT-B/14 at 224 px, whose 16 x 16 normalised patch tokens
  (``x_norm_patchtokens``) match the 16 x 16 tokens of DiT-XL/2 at 256 px. :class:`DinoV2` is a short
  re-implementation of that ViT which loads the *released* state dict (:func:`load_dinov2`): from a local
  ``.pth`` file, or downloaded by name when asked (``download=True``) from the release URL. Not
  ``torch.hub.load``, which fetches and runs the repository's code from GitHub each time, and not the
  ``transformers`` port, a large dependency this library does not otherwise need. Its inputs are prepared as
  REPA prepares them: ImageNet mean/std, then a bicubic resize to 224 px; its position embedding (37 x 37 in
  the released files) is resampled bicubically to the 16 x 16 grid. Registers (``*_reg`` models) and the
  SwiGLU giant are not supported.
* **A small CNN classifier** (:class:`PixelTeacher`, :func:`fit_pixel_teacher`) for the pixel-space profiles:
  trained on the training images in seconds, it stands in for a pretrained encoder, so the mechanism can
  be seen on a laptop. It is supervised (it has seen the labels), unlike DINOv2, which learned without labels:
  its features know the classes, which is more help than REPA's teacher gives.
"""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


def token_features(fmap: torch.Tensor, grid: int) -> torch.Tensor:
    """A feature map ``(N, D, h, w)`` at the DiT's ``grid x grid`` tokens, as ``(N, grid^2, D)`` in the DiT's
    row-major token order: area-averaged when the map is larger, nearest-neighbour when it is smaller."""
    if fmap.shape[-1] != grid or fmap.shape[-2] != grid:
        if fmap.shape[-1] >= grid and fmap.shape[-2] >= grid:
            fmap = F.adaptive_avg_pool2d(fmap, grid)
        else:
            fmap = F.interpolate(fmap, size=(grid, grid), mode="nearest")
    return fmap.flatten(2).transpose(1, 2)


# ----------------------------------------------------------------------------------------------------------
# DINOv2
# ----------------------------------------------------------------------------------------------------------

DINOV2_URL = "https://dl.fbaipublicfiles.com/dinov2/{arch}/{arch}_pretrain.pth"
#: The released ViTs with a standard MLP (facebookresearch/dinov2 README): name -> (width, depth, heads).
DINOV2_MODELS = {"dinov2-vits14": (384, 12, 6), "dinov2-vitb14": (768, 12, 12), "dinov2-vitl14": (1024, 24, 16)}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class TeacherNotFoundError(FileNotFoundError):
    """Teacher weights that are neither a local file nor cached, and were not asked to be downloaded."""


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, t, d))


class _LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class _Block(nn.Module):
    """Pre-norm transformer block with LayerScale: ``x + ls1(attn(norm1(x)))``, ``x + ls2(mlp(norm2(x)))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1, self.attn, self.ls1 = nn.LayerNorm(dim, eps=1e-6), _Attention(dim, heads), _LayerScale(dim)
        self.norm2, self.mlp, self.ls2 = nn.LayerNorm(dim, eps=1e-6), _Mlp(dim, int(dim * mlp_ratio)), _LayerScale(dim)

    def forward(self, x):
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class _PatchEmbed(nn.Module):
    def __init__(self, channels: int, dim: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class DinoV2(nn.Module):
    """The DINOv2 ViT with the parameter names of the released files (``cls_token``, ``pos_embed``,
    ``patch_embed.proj``, ``blocks.i.{norm1, attn.qkv, attn.proj, ls1.gamma, norm2, mlp.fc1, mlp.fc2,
    ls2.gamma}``, ``norm``, ``mask_token``). :meth:`feature_map` gives the normalised patch tokens of images in
    [-1, 1] at ``image_size`` (224: 16 x 16 tokens), as REPA uses them."""

    def __init__(self, dim: int = 768, depth: int = 12, heads: int = 12, patch_size: int = 14, pos_grid: int = 37,
                 image_size: int = 224, channels: int = 3):
        super().__init__()
        self.dim, self.patch_size, self.image_size = dim, patch_size, image_size
        self.patch_embed = _PatchEmbed(channels, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + pos_grid * pos_grid, dim))
        self.mask_token = nn.Parameter(torch.zeros(1, dim))  # in the released files; unused here
        self.blocks = nn.ModuleList(_Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    def _pos(self, grid: int) -> torch.Tensor:
        cls_pos, patch_pos = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        old = int(round(math.sqrt(patch_pos.shape[1])))
        if old != grid:
            patch_pos = patch_pos.reshape(1, old, old, -1).permute(0, 3, 1, 2).float()
            patch_pos = F.interpolate(patch_pos, size=(grid, grid), mode="bicubic", align_corners=False)
            patch_pos = patch_pos.permute(0, 2, 3, 1).reshape(1, grid * grid, -1).to(self.pos_embed.dtype)
        return torch.cat([cls_pos, patch_pos], dim=1)

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: prepared images ``(N, 3, S, S)``. Returns the normalised class token ``(N, D)`` and patch
        tokens ``(N, (S/14)^2, D)``."""
        tokens = self.patch_embed(x)
        tokens = torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], dim=1)
        tokens = tokens + self._pos(x.shape[-1] // self.patch_size)
        for block in self.blocks:
            tokens = block(tokens)
        tokens = self.norm(tokens)
        return tokens[:, 0], tokens[:, 1:]

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] to the ViT's input: [0, 1], ImageNet mean/std, bicubic resize to ``image_size``."""
        x = (images.float() + 1) / 2
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
        x = (x - mean) / std
        if x.shape[-1] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bicubic", align_corners=False)
        return x

    @torch.no_grad()
    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        """The patch tokens of ``images`` (N, C, H, W) in [-1, 1] as a map ``(N, D, grid, grid)``."""
        x = self.prepare(images).to(self.pos_embed.dtype)
        _, patches = self.forward_features(x)
        return patches.transpose(1, 2).reshape(len(x), self.dim, self.grid, self.grid)


def dinov2_config(state: dict) -> dict:
    """Width, depth, heads, patch size and position grid of a DINOv2 state dict, read off its shapes."""
    try:
        dim, channels, patch, _ = state["patch_embed.proj.weight"].shape
        positions = state["pos_embed"].shape[1] - 1
    except KeyError as err:
        raise ValueError(f"not a DINOv2 state dict: key {err.args[0]!r} is missing") from None
    if any(k.startswith("register_tokens") for k in state):
        raise ValueError("DINOv2 models with registers (*_reg) are not supported; use dinov2_vitb14_pretrain.pth")
    if any(".mlp.w12." in k for k in state):
        raise ValueError("the SwiGLU DINOv2 (ViT-g/14) is not supported; use ViT-S/B/L/14")
    depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
    heads = {384: 6, 768: 12, 1024: 16}.get(dim, max(1, dim // 64))
    grid = int(round(math.sqrt(positions)))
    return dict(dim=dim, depth=depth, heads=heads, patch_size=patch, pos_grid=grid, channels=channels)


def load_dinov2(source: str | os.PathLike = "dinov2-vitb14", download: bool = False, device="cpu",
                image_size: int = 224) -> DinoV2:
    """A DINOv2 teacher from a released state dict: ``source`` is a ``.pth`` file, or one of
    :data:`DINOV2_MODELS`, read from torch's hub cache (``torch.hub.get_dir()/checkpoints``) or, with
    ``download=True``, downloaded from the release URL into it. Returns the model in eval mode, frozen."""
    path = Path(source)
    if not path.is_file():
        if str(source) not in DINOV2_MODELS:
            raise TeacherNotFoundError(
                f"teacher {str(source)!r} is neither a file nor one of {', '.join(DINOV2_MODELS)}")
        arch = str(source).replace("-", "_")
        url = DINOV2_URL.format(arch=arch)
        path = Path(torch.hub.get_dir()) / "checkpoints" / f"{arch}_pretrain.pth"
        if not path.is_file():
            if not download:
                raise TeacherNotFoundError(
                    f"the {source} weights are not in {path.parent}: download them with download=True "
                    f"(--download), or fetch {url} yourself and pass the file")
            torch.hub.load_state_dict_from_url(url, map_location="cpu", progress=True)
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = DinoV2(**dinov2_config(state), image_size=image_size)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path} does not fit the DINOv2 ViT: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(device).eval().requires_grad_(False)


# ----------------------------------------------------------------------------------------------------------
# A small CNN for pixel-space data
# ----------------------------------------------------------------------------------------------------------


class PixelTeacher(nn.Module):
    """Three 3x3 convolutions (``width``, ``2 width``, ``2 width`` channels; batch norm, ReLU), a 2x max-pool
    after each of the first two while the map stays at least 8 px, a global average pool and a linear
    classifier. :meth:`feature_map` is the last convolution's output (the classifier's input before pooling).

    It sees each image as its silhouette (:func:`dit_core.eval.shapes.silhouette`: every pixel's colour distance
    from the median colour of the image's border), the input the shapes judge uses too. Measured with
    :func:`fit_pixel_teacher`'s defaults, on held-out real images: 99.4 % on the digits (11 s on one core of a
    busy machine), 100 % of 300 shapes (34 s, trained on the 900 images of ``dit-data shapes``); from the
    colours instead (standardised per image, with or without an edge map) 43-51 % on the shapes after 150
    steps: their colours vary at random."""

    def __init__(self, num_classes: int, image_size: int, width: int = 16):
        super().__init__()
        layers, cin, size = [], 1, image_size
        for i, cout in enumerate((width, 2 * width, 2 * width)):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
            if i < 2 and size >= 16:
                layers.append(nn.MaxPool2d(2))
                size //= 2
            cin = cout
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(cin, num_classes)
        self.dim = cin

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        from .eval.shapes import silhouette

        return self.body(silhouette(x.float()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.feature_map(x).mean(dim=(2, 3)))


def fit_pixel_teacher(images: torch.Tensor, labels: torch.Tensor, num_classes: int, steps: int = 200,
                      seed: int = 0, batch: int = 64, lr: float = 1e-2, width: int = 16,
                      flip: bool = True) -> PixelTeacher:
    """Train a :class:`PixelTeacher` on ``images`` (N, C, H, W) in [-1, 1] with their ``labels``: ``steps`` Adam
    steps on shuffled batches (a one-cycle learning rate up to ``lr``), random horizontal flips when ``flip``
    (not for digits: a mirrored 3 is no 3; a set of labels: of those classes only). Deterministic for a given seed and thread count. Returns it in eval
    mode, frozen, with ``train_accuracy`` (its accuracy on ``images``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = PixelTeacher(num_classes, images.shape[-1], width)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.25)
    net.train()
    order, position = torch.randperm(len(images), generator=g), 0
    for _ in range(steps):
        if position >= len(images):
            order, position = torch.randperm(len(images), generator=g), 0
        idx = order[position : position + batch]
        position += batch
        x = images[idx]
        if flip:
            mirrored = torch.rand(len(idx), generator=g) < 0.5
            if flip is not True:  # the labels whose images flip
                mirrored &= torch.tensor([int(c) in flip for c in labels[idx]], dtype=torch.bool)
            x = torch.where(mirrored[:, None, None, None], x.flip(-1), x)
        loss = F.cross_entropy(net(x), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    net.eval().requires_grad_(False)
    with torch.no_grad():
        predicted = torch.cat([net(images[i : i + 512]).argmax(1) for i in range(0, len(images), 512)])
    net.train_accuracy = float((predicted == labels).float().mean())
    return net


def run_teacher(cfg, dataset, out: Path, procs, device, grid: int):
    """The teacher of pixel-space training as ``(function, dim)``: the small CNN fitted on the training images
    (``repa_teacher`` auto or cnn; fitted once and kept in ``<out>/teacher.pt``, so a resumed run aligns to the
    same teacher), or DINOv2 (a name or a ``.pth``) run on each batch. ``procs``: the run's processes (``is_main``
    fits the teacher, the others wait for it when ``distributed``)."""
    name = cfg.repa_teacher
    if name in ("auto", "cnn"):
        from .checkpoint import atomic_save

        path = out / "teacher.pt"
        if procs.is_main and not path.exists():
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                xs, ys = zip(*(dataset[i][:2] for i in range(len(dataset))))
            images, labels = torch.stack(xs).float(), torch.as_tensor(ys, dtype=torch.long)
            num_classes = getattr(getattr(dataset, "dataset", dataset), "num_classes", None) or int(labels.max()) + 1
            started = time.perf_counter()
            flip = getattr(getattr(dataset, "dataset", dataset), "flip", cfg.flip)  # flip auto: the probe's classes
            net = fit_pixel_teacher(images, labels, max(2, num_classes), seed=cfg.seed, flip=flip)
            print(f"REPA teacher: a small CNN fitted on the {len(images)} training images in "
                  f"{time.perf_counter() - started:.0f} s, {net.train_accuracy:.1%} of them classified right "
                  f"(kept in {path})", flush=True)
            atomic_save({"state": net.state_dict(), "num_classes": net.head.out_features,
                         "image_size": images.shape[-1], "train_accuracy": net.train_accuracy}, path)
        if procs.distributed:  # the other processes wait until the main one has saved the teacher
            torch.distributed.barrier()
        saved = torch.load(path, map_location="cpu", weights_only=True)
        net = PixelTeacher(saved["num_classes"], saved["image_size"])
        net.load_state_dict(saved["state"])
        net = net.to(device).eval().requires_grad_(False)
    else:
        net = load_dinov2(name, device=device)

    @torch.no_grad()
    def features(x):
        return token_features(net.feature_map(x.float()).float(), grid)

    return features, int(net.dim)
