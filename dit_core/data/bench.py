"""A test bench of small image folders made up here, for measuring the own-images path on folders it was not tuned on.

A reader's folder is not ``dit-data shapes``: its files are wider or taller than square, its objects small or off
to one side, in any colours and file formats, and some classes change when mirrored (a letter L is not a mirrored
L). :func:`generate_bench` writes such folders, three kinds, each from any number of seeds:

- ``glyphs``: letters drawn from strokes defined here (no font file): ``A`` and ``T`` look the same mirrored, ``L``
  and ``Z`` do not. Slightly turned and slanted, strokes 14-20 % of the letter's height.
- ``shapes``: ``circle``, ``square``, ``triangle`` (point up) and ``arrow`` (pointing right: not mirror symmetric),
  small (22-60 % of the file's short side).
- ``textures``: a patch filled with a pattern: ``stripes`` (horizontal), ``bars`` (vertical), ``checks``, and
  ``slant`` (stripes rising to the right: not mirror symmetric).

Every file: a short side of 48, 64 or 96 px; 7 in 10 files wider or taller than square (up to 2:1); the object
anywhere in the file (off-centre, where a centre crop may cut it); colours that differ from the background by at
least 60 grey levels, a soft gradient background in 3 files of 10, 1 in 10 saved grey; PNG, JPEG, a few WebP and
BMP. The manifest (``bench.json``) records for every file its object's box (in the file's pixels), so what a crop
does to the objects can be checked against the truth, and which classes are mirror symmetric.

Each image is a pure function of ``(kind, seed, class, index)``, as in :mod:`dit_core.data.shapes`: the judges of
:mod:`dit_core.eval.bench` render other seeds' images in memory, never the folder's own. The classes of a kind and
their order are fixed (they seed the images).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ..atomic import atomic_write_text, replace_dir
from .shapes import encode

#: The kinds of folder and their classes, in a fixed order (the order seeds the images).
CLASSES = {
    "glyphs": ("A", "L", "T", "Z"),
    "shapes": ("arrow", "circle", "square", "triangle"),
    "textures": ("bars", "checks", "slant", "stripes"),
}
KINDS = tuple(CLASSES)
#: The classes that are not mirror symmetric: a mirrored file of one of them is another picture.
ASYMMETRIC = {"glyphs": ("L", "Z"), "shapes": ("arrow",), "textures": ("slant",)}
#: The object's longer side as a share of the file's short side, per kind.
OBJECT_SIZE = {"glyphs": (0.4, 0.8), "shapes": (0.22, 0.6), "textures": (0.5, 0.9)}
#: File formats and their share of the files.
FORMATS = (("png", 0.47), ("jpg", 0.43), ("webp", 0.05), ("bmp", 0.05))
SHORT_SIDES = (48, 64, 96)
#: Share of files that are square; the others have a long side 1.2 to 2 times the short one.
SQUARE_SHARE = 0.3
GREY_SHARE = 0.1
MANIFEST = "bench.json"
FORMAT_VERSION = 1
SUPERSAMPLE = 4

#: The strokes of each letter, polylines in a unit box (x right, y down), and the letter's width over its height.
GLYPHS = {
    "A": ([[(0.0, 1.0), (0.5, 0.0), (1.0, 1.0)], [(0.22, 0.64), (0.78, 0.64)]], 0.85),
    "L": ([[(0.0, 0.0), (0.0, 1.0), (1.0, 1.0)]], 0.62),
    "T": ([[(0.0, 0.0), (1.0, 0.0)], [(0.5, 0.0), (0.5, 1.0)]], 0.85),
    "Z": ([[(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0)]], 0.75),
}


def check_kind(kind: str) -> str:
    if kind not in CLASSES:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def _rng(kind: str, seed: int, cls: str, index: int) -> np.random.Generator:
    return np.random.default_rng([KINDS.index(kind), int(seed), CLASSES[kind].index(cls), int(index)])


def _luminance(rgb) -> float:
    return float(np.dot(rgb, (0.299, 0.587, 0.114)))


def _contrasting(rng, against, min_difference: float = 60.0) -> np.ndarray:
    while True:
        c = rng.uniform(0, 255, 3)
        if abs(_luminance(c) - _luminance(against)) >= min_difference:
            return c


def _glyph_mask(draw: ImageDraw.ImageDraw, cls: str, rng, cx: float, cy: float, height: float) -> None:
    strokes, aspect = GLYPHS[cls]
    width = height * aspect
    line = max(1, round(height * rng.uniform(0.14, 0.2)))
    angle, shear = rng.uniform(-0.14, 0.14), rng.uniform(-0.15, 0.15)
    c, s = math.cos(angle), math.sin(angle)
    inner = height - line  # the strokes' centres stay inside the letter's box
    for stroke in strokes:
        pts = []
        for x, y in stroke:
            x, y = x + rng.uniform(-0.03, 0.03), y + rng.uniform(-0.03, 0.03)
            px, py = (x - 0.5) * (width - line) + shear * (0.5 - y) * inner, (y - 0.5) * inner
            pts.append((cx + px * c - py * s, cy + px * s + py * c))
        draw.line(pts, fill=255, width=line, joint="curve")
        r = line / 2  # round caps, so a stroke's end is not cut square
        for x, y in (pts[0], pts[-1]):
            draw.ellipse([x - r, y - r, x + r, y + r], fill=255)


def _shape_mask(draw: ImageDraw.ImageDraw, cls: str, cx: float, cy: float, size: float) -> None:
    r = size / 2
    if cls == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    elif cls == "square":
        q = r * 0.9
        draw.rectangle([cx - q, cy - q, cx + q, cy + q], fill=255)
    elif cls == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.75), (cx - r, cy + r * 0.75)], fill=255)
    elif cls == "arrow":  # a shaft and a head, pointing right
        shaft, head = r * 0.28, r * 0.75
        draw.polygon([(cx - r, cy - shaft), (cx, cy - shaft), (cx, cy - head), (cx + r, cy), (cx, cy + head),
                      (cx, cy + shaft), (cx - r, cy + shaft)], fill=255)
    else:
        raise ValueError(cls)


def _texture(cls: str, rng, side: int, period: float) -> np.ndarray:
    """A 0/1 pattern of ``side`` x ``side`` (supersampled pixels) with the given period."""
    v, u = np.mgrid[0:side, 0:side].astype(np.float32)
    phase = rng.uniform(0, period)
    if cls == "stripes":
        return ((v + phase) % period < period / 2).astype(np.float32)
    if cls == "bars":
        return ((u + phase) % period < period / 2).astype(np.float32)
    if cls == "checks":
        return (((u + phase) // (period / 2) + (v + phase) // (period / 2)) % 2).astype(np.float32)
    if cls == "slant":  # stripes rising to the right, at 35-55 degrees
        a = math.radians(rng.uniform(35, 55))
        return ((u * math.sin(a) + v * math.cos(a) + phase) % period < period / 2).astype(np.float32)
    raise ValueError(cls)


def render_file(kind: str, cls: str, seed: int, index: int) -> tuple[Image.Image, dict]:
    """File ``index`` of class ``cls`` of a ``kind`` folder from ``seed``: the image (RGB or L) and its parameters
    (``size`` (w, h), ``box`` of the object in the file's pixels, ``format``, ``quality``)."""
    check_kind(kind)
    if cls not in CLASSES[kind]:
        raise ValueError(f"class {cls!r} is not one of the {kind} classes {', '.join(CLASSES[kind])}")
    rng = _rng(kind, seed, cls, index)
    short = int(rng.choice(SHORT_SIDES, p=(0.25, 0.5, 0.25)))
    long = short if rng.random() < SQUARE_SHARE else int(round(short * rng.uniform(1.2, 2.0)))
    w, h = (long, short) if rng.random() < 0.5 else (short, long)
    lo, hi = OBJECT_SIZE[kind]
    size = rng.uniform(lo, hi) * short  # the object's longer side
    bg = rng.uniform(0, 255, 3)
    fg = _contrasting(rng, bg)
    bg2 = np.clip(bg + rng.uniform(-50, 50, 3), 0, 255) if rng.random() < 0.3 else None
    if bg2 is not None and abs(_luminance(fg) - _luminance(bg2)) < 60:
        bg2 = None
    grey = rng.random() < GREY_SHARE
    names, weights = zip(*FORMATS)
    fmt, quality = str(rng.choice(names, p=weights)), int(rng.integers(70, 96))

    S = SUPERSAMPLE
    margin = 0.03 * short
    half = size / 2 + margin
    cx, cy = rng.uniform(half, w - half), rng.uniform(half, h - half)
    mask = Image.new("L", (w * S, h * S), 0)
    draw = ImageDraw.Draw(mask)
    pattern_fg = None
    if kind == "glyphs":
        _glyph_mask(draw, cls, rng, cx * S, cy * S, size * S)
    elif kind == "shapes":
        _shape_mask(draw, cls, cx * S, cy * S, size * S)
    else:  # a rounded patch; inside it the pattern alternates a second colour with the patch's own
        r = size * S / 2
        draw.rounded_rectangle([cx * S - r, cy * S - r, cx * S + r, cy * S + r], radius=r * 0.25, fill=255)
        period = size * S / rng.uniform(2.8, 3.6)
        tile = _texture(cls, rng, w * S if w > h else h * S, period)[: h * S, : w * S]
        pattern_fg = Image.fromarray((tile * 255).astype(np.uint8)).resize((w, h), resample=Image.BOX)
        pattern_fg = np.asarray(pattern_fg, dtype=np.float32)[..., None] / 255.0
        fg2 = _contrasting(rng, fg, 80)
    alpha = np.asarray(mask.resize((w, h), resample=Image.BOX), dtype=np.float32)[..., None] / 255.0
    if bg2 is None:
        canvas = np.broadcast_to(bg.astype(np.float32), (h, w, 3))
    else:
        theta = rng.uniform(0, 2 * math.pi)
        ux, uy = np.linspace(-0.5, 0.5, w, dtype=np.float32), np.linspace(-0.5, 0.5, h, dtype=np.float32)
        ramp = (math.cos(theta) * ux[None, :] + math.sin(theta) * uy[:, None]) * math.sqrt(0.5) + 0.5
        canvas = bg.astype(np.float32) * (1 - ramp[..., None]) + bg2.astype(np.float32) * ramp[..., None]
    colour = fg.astype(np.float32) if pattern_fg is None else \
        fg.astype(np.float32) * (1 - pattern_fg) + fg2.astype(np.float32) * pattern_fg
    pixels = canvas + alpha * (colour - canvas)
    img = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "RGB")
    if grey:
        img = img.convert("L")
    ys, xs = np.nonzero(alpha[..., 0] > 0.5)
    box = [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1] if len(xs) else None
    return img, {"size": [w, h], "box": box, "format": fmt, "quality": quality, "grey": grey}


def real_files(kind: str, seed: int, per_class: int, start: int = 0, classes=None):
    """``(images, labels, params)``: files ``start .. start + per_class - 1`` of each class, as PIL images decoded
    from their file format (what the trainer opens), their labels (the class's index in ``classes``, default the
    kind's sorted classes) and their parameters."""
    from .shapes import _decode

    classes = list(classes or CLASSES[kind])
    images, labels, params = [], [], []
    for label, cls in enumerate(classes):
        for i in range(start, start + per_class):
            img, p = render_file(kind, cls, seed, i)
            images.append(_decode(encode(img, p["format"], p["quality"]), img.mode).convert("RGB"))
            labels.append(label)
            params.append(p)
    return images, labels, params


def generate_bench(out_dir: str | os.PathLike, kind: str, seed: int = 0, per_class: int = 300,
                   overwrite: bool = False) -> Path:
    """Write ``per_class`` files of each class of ``kind`` to ``out_dir/<class>/<class>_<i>.<ext>`` with the
    manifest ``bench.json``. Deterministic, idempotent and atomic as :func:`dit_core.data.shapes.generate_shapes`:
    a folder made with the same parameters is returned as it is. Returns ``out_dir``."""
    check_kind(kind)
    if per_class < 1:
        raise ValueError(f"per_class must be at least 1, got {per_class}")
    out_dir = Path(out_dir).absolute()
    params = {"kind": kind, "seed": int(seed), "per_class": int(per_class)}
    if _matches(out_dir, params):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (overwrite and (out_dir / MANIFEST).is_file()):
            raise FileExistsError(f"cannot write the bench folder to {str(out_dir)!r}: it holds other files; "
                                  "choose an empty or new folder" + (" or pass --overwrite" if (out_dir / MANIFEST)
                                                                     .is_file() else ""))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        objects, formats = {}, {}
        for cls in CLASSES[kind]:
            (tmp / cls).mkdir()
            for i in range(per_class):
                img, p = render_file(kind, cls, seed, i)
                name = f"{cls}/{cls}_{i:04d}.{p['format']}"
                (tmp / name).write_bytes(encode(img, p["format"], p["quality"]))
                objects[name] = {"size": p["size"], "box": p["box"]}
                formats[p["format"]] = formats.get(p["format"], 0) + 1
        manifest = {"source": "dit_core.data.bench.generate_bench (rendered, no download)",
                    "format_version": FORMAT_VERSION, **params, "classes": list(CLASSES[kind]),
                    "mirror_asymmetric": list(ASYMMETRIC[kind]), "formats": dict(sorted(formats.items())),
                    "total": per_class * len(CLASSES[kind]), "objects": objects}
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        replace_dir(tmp, out_dir, lambda found: _matches(found, params))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def read_manifest(folder: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _matches(out_dir: Path, params: dict) -> bool:
    m = read_manifest(out_dir)
    return m is not None and m.get("format_version") == FORMAT_VERSION and all(m.get(k) == v for k, v in params.items())


def add_arguments(p) -> None:
    """The options of ``dit-data bench``."""
    p.add_argument("out", help="output folder (created; left alone if already generated with the same settings)")
    p.add_argument("--kind", choices=KINDS, default="glyphs",
                   help="glyphs (A, L, T, Z), shapes (arrow, circle, square, triangle) or textures (bars, checks, "
                        "slant, stripes)")
    p.add_argument("--seed", type=int, default=0, help="seed of every file (default 0)")
    p.add_argument("--per-class", type=int, default=300, help="files per class (default 300)")
    p.add_argument("--overwrite", action="store_true", help="replace a folder generated with other settings")


def run(args) -> int:
    import sys

    try:
        out = generate_bench(args.out, args.kind, seed=args.seed, per_class=args.per_class, overwrite=args.overwrite)
    except (FileExistsError, ValueError) as err:
        print(f"dit-data bench: {err}", file=sys.stderr)
        return 2
    m = read_manifest(out)
    fmts = ", ".join(f"{n} {k}" for k, n in m["formats"].items())
    print(f"{args.kind} in {out}: {m['total']} files, classes {', '.join(m['classes'])} (not mirror symmetric: "
          f"{', '.join(m['mirror_asymmetric'])}); {fmts}")
    return 0
