"""Where the object is in a file: a square crop that keeps it, and the share of files a centre crop would cut.

DiT trains on square images, and the ADM centre crop (:func:`dit_core.data.crop.center_crop_arr`) takes the
middle square of every file. On ImageNet photographs, whose objects are mostly central, that is what the official
code does and what its numbers rest on, so the GPU track keeps it. A reader's own files are often wider or taller
than square with the object off to one side (a scan, a phone photo of a thing on a table): the centre crop then
cuts the object, and a model trained on such crops learns cut objects as a mode of the data.

:func:`object_window` places the square window (its side the file's short side, as the centre crop's) where the
object is instead. The object is what differs from the background, taken as the median colour of the file's
border: each pixel's colour distance from it (:func:`background_distance`) is summed along the long side, and the
window is slid to hold the most of that mass. Where the centre window already holds nearly all of it (a central
object, a photograph whose every part differs from the border, a plain picture: "nothing stands out"), the window
stays the centre crop, exactly. Among the windows that hold the object, the one centred on it is taken, so the
object does not end up at the window's edge.

:func:`locate` describes one file: its object's box (the pixels clearly above the background's distance), how
large the object is against the window, and whether the centre crop would cut it (more than :data:`CUT_SHARE` of
its pixels outside the centre square). The pre-flight probe (:mod:`dit_core.data.probe`) reports these over a
folder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .crop import center_crop_arr

#: The window search works on a copy whose short side is at most this many pixels (a few milliseconds a file).
WORK_SIDE = 48
#: The centre window is kept when it holds at least this share of the best window's mass ("nothing stands out").
KEEP_CENTRE = 0.95
#: Windows holding at least this share of the best window's mass hold the object; the one centred on it is taken.
HOLDS_OBJECT = 0.98
#: A pixel belongs to the object when its distance from the background is above this share of the file's largest.
OBJECT_THRESHOLD = 0.4
#: Files whose largest colour distance from the border is below this (on 0..1 channels) show no object at all.
MIN_CONTRAST = 0.08
#: The centre crop "cuts" an object when more than this share of the object's pixels lie outside the centre square.
CUT_SHARE = 0.05


def _small(img: Image.Image) -> tuple[np.ndarray, float]:
    """The image as floats in 0..1 (H, W, C), reduced so its short side is at most :data:`WORK_SIDE`; and the
    factor from the small copy's pixels to the file's."""
    w, h = img.size
    factor = max(1.0, min(w, h) / WORK_SIDE)
    if factor > 1.0:
        img = img.resize((max(1, round(w / factor)), max(1, round(h / factor))), resample=Image.BOX)
    arr = np.asarray(img, dtype=np.float32) / 255.0
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return arr, w / arr.shape[1]


def background_distance(arr: np.ndarray) -> np.ndarray:
    """Each pixel's colour distance from the background, the median colour of the image's one-pixel border:
    (H, W, C) -> (H, W). The same idea as the judges' silhouette (:func:`dit_core.eval.shapes.silhouette`)."""
    border = np.concatenate([arr[0], arr[-1], arr[:, 0], arr[:, -1]], axis=0)
    background = np.median(border, axis=0)
    return np.sqrt(np.square(arr - background).sum(axis=-1))


@dataclass(frozen=True)
class Located:
    """One file's object: ``box`` (x0, y0, x1, y1 in the file's pixels, end exclusive; None: no object stands
    out), ``window`` (left, top, side: the square :func:`object_window` crops), ``centre_cut`` (whether the centre
    crop would cut the object), ``size`` (the object's longer side over the window's side, 0 without an object)."""

    box: tuple | None
    window: tuple
    centre_cut: bool
    size: float


def _window_along(profile: np.ndarray, side: int) -> int:
    """The start (in the small copy's pixels) of the window of ``side`` along a long axis whose object mass per
    position is ``profile``: the centre, unless another window holds clearly more (see the module docstring)."""
    n = len(profile)
    centre = (n - side) // 2
    if n <= side:
        return 0
    sums = np.convolve(profile, np.ones(side), mode="valid")  # mass of the window starting at each position
    best = float(sums.max())
    if best <= 0 or sums[centre] >= KEEP_CENTRE * best:
        return centre
    holding = np.flatnonzero(sums >= HOLDS_OBJECT * best)
    mid = float((profile * np.arange(n)).sum() / profile.sum())  # the object's centre along the axis
    return int(holding[np.argmin(np.abs(holding + side / 2 - mid))])


def locate(img: Image.Image) -> Located:
    """Where the object of ``img`` is, the square window that keeps it, and what the centre crop would do."""
    w, h = img.size
    side = min(w, h)
    arr, factor = _small(img)
    d = background_distance(arr)
    top_distance = float(d.max())
    mask = d > max(OBJECT_THRESHOLD * top_distance, MIN_CONTRAST / 2)
    if top_distance < MIN_CONTRAST or not mask.any():
        left, top = (w - side) // 2, (h - side) // 2
        return Located(None, (left, top, side), False, 0.0)
    # the mass that the window search weighs: distance above the background's typical level, so that a soft
    # gradient or JPEG noise spread over the whole file does not pull the window
    mass = np.clip(d - np.median(d), 0.0, None)
    small_side = min(d.shape)
    if w > h:
        start = _window_along(mass.sum(axis=0), small_side)
        left, top = min(w - side, round(start * factor)), 0
    elif h > w:
        start = _window_along(mass.sum(axis=1), small_side)
        left, top = 0, min(h - side, round(start * factor))
    else:
        left, top = 0, 0
    ys, xs = np.nonzero(mask)
    box = (int(xs.min() * factor), int(ys.min() * factor), int(np.ceil((xs.max() + 1) * factor)),
           int(np.ceil((ys.max() + 1) * factor)))
    # the centre square in the small copy's pixels, and the object's pixels outside it
    cy, cx = (d.shape[0] - small_side) // 2, (d.shape[1] - small_side) // 2
    inside = mask[cy : cy + small_side, cx : cx + small_side].sum()
    cut = (1.0 - inside / mask.sum()) > CUT_SHARE
    size = max(box[2] - box[0], box[3] - box[1]) / side
    return Located(box, (int(left), int(top), int(side)), bool(cut), float(min(size, 1.0)))


def object_window(img: Image.Image) -> tuple[int, int, int]:
    """``(left, top, side)``: the square of the file's short side placed where its object is (the centre square
    when nothing stands out or the file is square)."""
    return locate(img).window


def object_crop(img: Image.Image, image_size: int) -> Image.Image:
    """``img`` cut to :func:`object_window` and brought to ``image_size`` as the ADM crop brings a square (halved
    with a box filter while at least twice the size, then bicubic): for a square file, exactly the ADM crop."""
    left, top, side = object_window(img)
    if img.size != (side, side):
        img = img.crop((left, top, left + side, top + side))
    return center_crop_arr(img, image_size)
