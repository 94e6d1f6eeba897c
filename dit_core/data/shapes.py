"""A reader's "own folder", made up: simple coloured shapes as an ImageFolder, one sub-folder per class.

The chapters end with readers training on their own pictures. To measure that path without anybody's
photos, :func:`generate_shapes` writes a folder that looks like one a reader might collect: a few hundred
images per class (``circle/``, ``square/``, ``triangle/``, optionally ``star/`` and ``cross/``), each a
shape of varied size, position and colour on a plain or gradient background, saved at varied pixel sizes
and in varied file formats (mostly PNG and JPEG, a few WebP and BMP), so the loader's decoding, resizing
and center crop are all exercised. The shapes stand upright by default, as the things in most photographs
do (squares axis-aligned, triangles point up); ``rotation="any"`` turns each one by a random angle, a harder
folder: at 16 px a turned square of 5-10 pixels is hard to draw with straight edges and sharp corners (the
``small-images`` profile's YAML file has the figures of both).

Every image is a pure function of ``(seed, shape, index)``: the random numbers of image ``i`` of class
``star`` come from a generator seeded by those three numbers alone (the shape's position in :data:`SHAPES`,
not in the chosen class list), so a folder is bit-identical on every machine, and adding a class or more
images per class leaves the existing files unchanged. The same function renders images in memory
(:func:`real_shapes`) for the classifier in :mod:`dit_core.eval.shapes`, which therefore learns from
exactly the distribution a model is trained on, without reading the folder.

Writing is atomic at the folder level: everything goes into a temporary folder beside ``out_dir``, which
is renamed into place at the end, so an interrupted run leaves no half-written dataset, and a folder that
already holds the same parameters (recorded in ``shapes.json``) is left alone.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from ..atomic import atomic_write_text, replace_dir

#: Every shape this module can draw, in a fixed order: the order seeds the images, never change it.
SHAPES = ("circle", "square", "triangle", "star", "cross")
#: The default classes: three shapes that differ in outline, not in colour.
DEFAULT_CLASSES = ("circle", "square", "triangle")
#: File formats and their share of the images: what a folder gathered from several sources looks like.
FORMATS = (("png", 0.45), ("jpg", 0.40), ("webp", 0.08), ("bmp", 0.07))
#: Pixel sides of the saved files (the trainer resizes them to its ``image_size``).
FILE_SIZES = (48, 64, 96)
#: How the shapes are turned: "upright" (squares and crosses axis-aligned, triangles and stars with a point
#: straight up; the default of a folder) or "any" angle (the default of the judge's in-memory images). Upright images draw the same random numbers as turned ones
#: and only ignore the angle, so the two folders of one seed hold the same sizes, places, colours and files.
ROTATIONS = ("any", "upright")
#: The angle (radians, image axes: y grows downwards) that makes each polygon upright.
UPRIGHT = {"circle": 0.0, "square": math.pi / 4, "triangle": -math.pi / 2, "star": -math.pi / 2, "cross": 0.0}
MANIFEST = "shapes.json"
FORMAT_VERSION = 1
# Shapes are drawn this many times larger and reduced with a box filter: smooth (anti-aliased) edges.
SUPERSAMPLE = 4


def _rng(seed: int, shape: str, index: int) -> np.random.Generator:
    """The generator of image ``index`` of ``shape``: independent of every other image."""
    return np.random.default_rng([int(seed), SHAPES.index(shape), int(index)])


def _luminance(rgb: np.ndarray) -> float:
    return float(np.dot(rgb, (0.299, 0.587, 0.114)))


def _colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Foreground, background and (for a gradient) a second background colour, as floats in 0..255.

    The foreground differs from the background by at least 60 grey levels in luminance, so that the shape
    stays visible in grey too (a model trained with ``channels: 1`` must still see it): colour alone says
    nothing about the class.
    """
    while True:
        fg, bg = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        if abs(_luminance(fg) - _luminance(bg)) >= 60:
            break
    bg2 = None
    if rng.random() < 0.3:  # a soft gradient background: the second colour on the background's side
        bg2 = np.clip(bg + rng.uniform(-50, 50, 3), 0, 255)
        if abs(_luminance(fg) - _luminance(bg2)) < 60:
            bg2 = None
    return fg, bg, bg2


def _outline(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]] | None:
    """Polygon vertices of ``shape`` centred at (cx, cy) with size ``r`` (None for the circle).

    The circumradius of each polygon is scaled so that all shapes cover a similar area as a circle of
    radius ``r``: the classes differ in outline, not in how much colour they put on the canvas.
    """
    def ring(radii, count):
        return [(cx + radii[k % len(radii)] * math.cos(angle + 2 * math.pi * k / count),
                 cy + radii[k % len(radii)] * math.sin(angle + 2 * math.pi * k / count)) for k in range(count)]

    if shape == "circle":
        return None
    if shape == "square":
        return ring([r * 1.2], 4)
    if shape == "triangle":
        return ring([r * 1.45], 3)
    if shape == "star":
        return ring([r * 1.35, r * 1.35 * 0.45], 10)
    if shape == "cross":  # a plus sign: 12 vertices, arms a third of the full width
        w, h = r * 1.25, r * 1.25 / 3
        pts = [(h, w), (h, h), (w, h), (w, -h), (h, -h), (h, -w), (-h, -w), (-h, -h), (-w, -h), (-w, h),
               (-h, h), (-h, w)]
        c, s = math.cos(angle), math.sin(angle)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]
    raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")


def render_shape(shape: str, seed: int, index: int, mode: str = "RGB",
                 rotation: str = "any") -> tuple[Image.Image, dict]:
    """Draw image ``index`` of ``shape``; returns the PIL image and its parameters (size, format, ...).

    Random per image: the file's pixel side (:data:`FILE_SIZES`), the shape's size (radius 18-36 % of the
    side), its centre (anywhere that keeps it inside the image), rotation (unless ``rotation="upright"``,
    :data:`ROTATIONS`), colours, a gradient background in 3 of 10 images, the file format (:data:`FORMATS`)
    and its quality.
    """
    if mode not in ("RGB", "L"):
        raise ValueError(f"mode must be 'RGB' or 'L', got {mode!r}")
    _check_rotation(rotation)
    rng = _rng(seed, shape, index)
    side = int(rng.choice(FILE_SIZES, p=(0.25, 0.5, 0.25)))
    big = side * SUPERSAMPLE
    r = rng.uniform(0.18, 0.36) * big
    margin = r * 1.05 + 0.04 * big
    cx, cy = rng.uniform(margin, big - margin, 2)
    angle = rng.uniform(0, 2 * math.pi)  # drawn either way: the random numbers after it stay the same
    if rotation == "upright":
        angle = UPRIGHT[shape]
    fg, bg, bg2 = _colours(rng)
    names, weights = zip(*FORMATS)
    fmt = str(rng.choice(names, p=weights))
    quality = int(rng.integers(70, 96))

    # The background at the file's size; the shape as a coverage mask drawn SUPERSAMPLE times larger and
    # box-filtered down (anti-aliased edges), then laid over the background: colour = bg + a * (fg - bg).
    if bg2 is None:
        canvas = np.broadcast_to(bg.astype(np.float32), (side, side, 3))
    else:  # linear gradient along a random direction
        theta = rng.uniform(0, 2 * math.pi)
        u = np.linspace(-0.5, 0.5, side, dtype=np.float32)
        ramp = (math.cos(theta) * u[None, :] + math.sin(theta) * u[:, None]) * math.sqrt(0.5) + 0.5
        canvas = bg.astype(np.float32) * (1 - ramp[..., None]) + bg2.astype(np.float32) * ramp[..., None]
    mask = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(mask)
    points = _outline(shape, cx, cy, r, angle)
    if points is None:
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    else:
        draw.polygon(points, fill=255)
    alpha = np.asarray(mask.resize((side, side), resample=Image.BOX), dtype=np.float32)[..., None] / 255.0
    pixels = canvas + alpha * (fg.astype(np.float32) - canvas)
    img = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "RGB")
    if mode == "L":
        img = img.convert("L")
    params = {"side": side, "format": fmt, "quality": quality, "radius": r / big, "centre": [cx / big, cy / big],
              "angle": angle, "gradient": bg2 is not None}
    return img, params


def encode(img: Image.Image, fmt: str, quality: int = 90) -> bytes:
    """The bytes of ``img`` in file format ``fmt`` (png, jpg, webp, bmp), as written to the folder."""
    buf = io.BytesIO()
    if fmt == "jpg":
        img.save(buf, format="JPEG", quality=quality)
    elif fmt == "webp":
        img.save(buf, format="WEBP", quality=quality, method=4)
    elif fmt == "png":
        img.save(buf, format="PNG", optimize=False)
    elif fmt == "bmp":
        img.save(buf, format="BMP")
    else:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(f for f, _ in FORMATS)}")
    return buf.getvalue()


def _check_classes(classes) -> tuple[str, ...]:
    classes = tuple(classes)
    unknown = [c for c in classes if c not in SHAPES]
    if unknown or not classes:
        raise ValueError(f"classes must be some of {', '.join(SHAPES)}, got {list(classes)}")
    if len(set(classes)) != len(classes):
        raise ValueError(f"classes repeat: {list(classes)}")
    return classes


def _check_rotation(rotation: str) -> str:
    if rotation not in ROTATIONS:
        raise ValueError(f"rotation must be one of {', '.join(ROTATIONS)}, got {rotation!r}")
    return rotation


def generate_shapes(
    out_dir: str | os.PathLike,
    per_class: int = 300,
    classes=DEFAULT_CLASSES,
    seed: int = 0,
    mode: str = "RGB",
    overwrite: bool = False,
    rotation: str = "upright",
) -> Path:
    """Write ``per_class`` images of each shape in ``classes`` to ``out_dir/<shape>/<shape>_<i>.<ext>``.

    - deterministic: the same arguments give the same bytes (see the module docstring);
    - ``mode``: "RGB" (coloured) or "L" (grey files, for a grayscale model);
    - ``rotation``: "upright" shapes or turned at "any" angle (:data:`ROTATIONS`: the same images otherwise);
    - idempotent and atomic like :func:`dit_core.data.export_digits`: an existing folder made with the same
      parameters is returned as it is; other parameters raise unless ``overwrite=True``; files are written to
      a temporary folder that is renamed into place;
    - ``shapes.json`` records the parameters and the number of files of each format.

    Returns ``out_dir``. A 900-image folder takes about 2 s.
    """
    classes = _check_classes(classes)
    if per_class < 1:
        raise ValueError(f"per_class must be at least 1, got {per_class}")
    out_dir = Path(out_dir).absolute()
    params = {"per_class": int(per_class), "classes": list(classes), "seed": int(seed), "mode": mode,
              "rotation": _check_rotation(rotation)}
    if _matches(out_dir, params):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (overwrite and (out_dir / MANIFEST).is_file()):
            hint = (f"it was generated with other parameters ({_differences(out_dir, params)}); pass overwrite=True "
                    "(--overwrite) to replace it" if (out_dir / MANIFEST).is_file()
                    else "it holds other files; choose an empty or new folder")
            raise FileExistsError(f"cannot write the shapes to {str(out_dir)!r}: {hint}")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        formats: dict[str, int] = {}
        sides: dict[str, int] = {}
        for shape in classes:
            folder = tmp / shape
            folder.mkdir()
            for i in range(per_class):
                img, p = render_shape(shape, seed, i, mode, rotation)
                (folder / f"{shape}_{i:04d}.{p['format']}").write_bytes(encode(img, p["format"], p["quality"]))
                formats[p["format"]] = formats.get(p["format"], 0) + 1
                sides[str(p["side"])] = sides.get(str(p["side"]), 0) + 1
        manifest = {
            "source": "dit_core.data.shapes.generate_shapes (rendered, no download)",
            "format_version": FORMAT_VERSION,
            **params,
            "counts": {shape: per_class for shape in classes},
            "formats": dict(sorted(formats.items())),
            "sides": dict(sorted(sides.items(), key=lambda kv: int(kv[0]))),
            "total": per_class * len(classes),
        }
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        replace_dir(tmp, out_dir, lambda found: _matches(found, params))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def real_shapes(classes=DEFAULT_CLASSES, per_class: int = 100, seed: int = 1, image_size: int = 32,
                mode: str = "RGB", start: int = 0, rotation: str = "any") -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``start .. start + per_class - 1`` of each class, rendered in memory and prepared exactly as the
    trainer prepares the files: encoded in their format, decoded, ADM-center-cropped to ``image_size``.

    Returns ``(images, labels)``: float32 ``(N, C, image_size, image_size)`` in [-1, 1] and int64 labels, the
    index of each shape in ``classes`` (pass the classes in the trainer's order: sorted folder names).
    Use a ``seed`` other than the training folder's to get images the model has never seen. ``rotation``: "any"
    by default (the judge of :mod:`dit_core.eval.shapes` learns from shapes at every angle, upright ones
    included), "upright" for the images of a folder written with :func:`generate_shapes`' default.
    """
    from .images import resize_to, to_tensor

    classes = _check_classes(classes)
    xs, ys = [], []
    for label, shape in enumerate(classes):
        for i in range(start, start + per_class):
            img, p = render_shape(shape, seed, i, mode, rotation)
            decoded = _decode(encode(img, p["format"], p["quality"]), mode)
            xs.append(to_tensor(resize_to(decoded, image_size, "adm")))
            ys.append(label)
    return torch.stack(xs), torch.tensor(ys, dtype=torch.long)


def _decode(data: bytes, mode: str) -> Image.Image:
    """Decode file bytes as :func:`dit_core.data.images.load_image` decodes a file."""
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        return img.convert(mode) if img.mode != mode else img.copy()


def _read_manifest(out_dir: Path) -> dict | None:
    """The folder's ``shapes.json`` (None when missing or unreadable)."""
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest


def _matches(out_dir: Path, params: dict) -> bool:
    manifest = _read_manifest(out_dir)
    return (manifest is not None and manifest.get("format_version") == FORMAT_VERSION
            and all(manifest.get(k) == v for k, v in params.items()))


def _differences(out_dir: Path, params: dict) -> str:
    """What differs between the folder's manifest and ``params``, as "key: theirs, not ours" pieces."""
    manifest = _read_manifest(out_dir)
    if manifest is None:
        return "its shapes.json is unreadable"
    diffs = [f"{k}: {manifest.get(k)!r}, not {v!r}" for k, v in params.items() if manifest.get(k) != v]
    return "; ".join(diffs) or f"format version {manifest.get('format_version')}, not {FORMAT_VERSION}"


def main(argv=None) -> int:
    """``python -m dit_core.data.shapes OUT [--per-class 300] [--classes circle,square,triangle] [--seed 0]``
    (the same as ``dit-data shapes OUT``)."""
    import argparse

    p = argparse.ArgumentParser(prog="dit-data shapes", description="write a folder of coloured shapes (an "
                                "ImageFolder with one sub-folder per shape) to try the own-images path")
    add_arguments(p)
    args = p.parse_args(argv)
    return run(args)


def add_arguments(p) -> None:
    """The options of ``dit-data shapes`` (shared by :func:`main` and the ``dit-data`` sub-command)."""
    p.add_argument("out", help="output folder (created; left alone if already generated with the same settings)")
    p.add_argument("--per-class", type=int, default=300, help="images per class (default 300)")
    p.add_argument("--classes", default=",".join(DEFAULT_CLASSES),
                   help=f"comma-separated shapes from {', '.join(SHAPES)} (default: {','.join(DEFAULT_CLASSES)})")
    p.add_argument("--seed", type=int, default=0, help="seed of every image (default 0)")
    p.add_argument("--grayscale", action="store_true", help="grey files instead of coloured ones")
    p.add_argument("--rotation", choices=ROTATIONS, default="upright",
                   help="upright shapes (default: axis-aligned squares, triangles point up) or turned at any angle")
    p.add_argument("--overwrite", action="store_true", help="replace a folder generated with other settings")


def run(args) -> int:
    import sys

    try:
        out = generate_shapes(args.out, per_class=args.per_class, classes=[c.strip() for c in args.classes.split(",")
                                                                           if c.strip()],
                              seed=args.seed, mode="L" if args.grayscale else "RGB", overwrite=args.overwrite,
                              rotation=args.rotation)
    except (FileExistsError, ValueError) as err:
        print(f"dit-data shapes: {err}", file=sys.stderr)
        return 2
    m = json.loads((out / MANIFEST).read_text())
    fmts = ", ".join(f"{n} {k}" for k, n in m["formats"].items())
    print(f"shapes in {out}: {m['total']} images, {len(m['classes'])} classes ({', '.join(m['classes'])}); {fmts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
