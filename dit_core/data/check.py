"""The dataset check: find every file that would surprise the loader, before a run of hours meets it.

``dit-data check ROOT`` opens and decodes every image of an ImageFolder dataset and reports the class
counts, the image sizes, and each odd file together with what :class:`~dit_core.data.ImageFolderDataset`
(and latent extraction) will do about it. The actions come from the same function the loader uses,
:func:`~dit_core.data.images.load_image`, so the report cannot drift from the behaviour.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from PIL import Image

from .images import HIGH_BIT_DEPTH_MODES, SPLIT_NAMES, find_classes, make_samples

SKIP = "skipped: the loader warns once and serves the next readable image"

# kind -> what the loader does about it. The first group makes the loader skip the file.
ACTIONS = {
    "zero-byte": "skipped: left out when the folder is scanned",
    "unreadable": SKIP,
    "not-an-image": SKIP,
    "truncated": SKIP,
    "corrupt": SKIP,
    "too-large": SKIP,
    "cmyk": "converted to RGB without a colour profile (colours may shift)",
    "rgba": "alpha channel dropped by convert('RGB') (transparent areas show their stored colour)",
    "palette": "palette expanded to RGB",
    "grayscale": "grey value copied into R, G and B",
    "16-bit": "scaled from 16 to 8 bits, then converted",
    "colour": "converted to grayscale (the dataset is read in mode 'L')",
    "odd-mode": "converted by PIL's convert()",
    "too-small": "upscaled with bicubic to the training size (the result is blurry)",
    "extreme-aspect": "the center crop keeps only the middle square of a long image",
    "empty-class": "the class keeps its label but no image of it is ever served",
    "class-mismatch": "labels follow each split's own sorted folders, so they disagree between splits",
}
SKIPPED_KINDS = frozenset(k for k, a in ACTIONS.items() if a.startswith("skipped"))

# Below this many files, worker processes cost more than they save.
PARALLEL_MIN_FILES = 256

# Aspect ratio (long side / short side) above which the center crop discards most of an image.
EXTREME_ASPECT = 3.0


@dataclass
class Problem:
    """One odd file: where, what, details, and what the loader does about it."""

    path: str
    kind: str
    detail: str
    action: str

    @property
    def skipped(self) -> bool:
        return self.kind in SKIPPED_KINDS


@dataclass
class DatasetReport:
    """Result of :func:`check_dataset`.

    ``splits`` maps a split name ("" when the dataset has no split folders) to ``{class: readable
    images}``; ``sizes`` holds min / median / max of width and height over readable images;
    ``problems`` lists every odd file; ``ignored`` the files that are not images by extension.
    """

    root: str
    splits: dict[str, dict[str, int]]
    files: int
    readable: int
    sizes: dict[str, float]
    modes: dict[str, int]
    formats: dict[str, int]
    problems: list[Problem]
    ignored: list[str]
    image_size: int | None
    min_size: int
    decoded: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def class_counts(self) -> dict[str, int]:
        """Readable images per class, summed over the splits."""
        total: Counter = Counter()
        for counts in self.splits.values():
            total.update(counts)
        return dict(sorted(total.items()))

    @property
    def num_classes(self) -> int:
        return len(self.class_counts)

    @property
    def skipped(self) -> list[Problem]:
        return [p for p in self.problems if p.skipped]

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(p.kind for p in self.problems).most_common())

    @property
    def ok(self) -> bool:
        """True when no file is skipped and the class folders agree: safe to train on as it is."""
        return not any(p.skipped or p.kind in ("empty-class", "class-mismatch") for p in self.problems)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["class_counts"] = self.class_counts
        d["by_kind"] = self.by_kind()
        d["ok"] = self.ok
        return d

    def __str__(self) -> str:
        return format_report(self)


def inspect_image(path: str, mode: str = "RGB", decode: bool = True) -> tuple[dict | None, list[tuple[str, str]]]:
    """Open one file as the loader would. Returns ``(info, issues)``: ``info`` has width, height, mode
    and format (``None`` when the file cannot be used), ``issues`` is a list of ``(kind, detail)``."""
    try:
        size = os.path.getsize(path)
    except OSError as err:
        return None, [("unreadable", str(err))]
    if size == 0:
        return None, [("zero-byte", "the file is empty (an interrupted download or copy)")]
    try:
        with Image.open(path) as img:
            info = {"width": img.size[0], "height": img.size[1], "mode": img.mode, "format": img.format or "?"}
            transparency = "transparency" in img.info
            if decode:
                img.load()
    except PermissionError as err:
        return None, [("unreadable", str(err))]
    except Image.UnidentifiedImageError:
        with open(path, "rb") as f:
            head = f.read(32)
        return None, [("not-an-image", f"PIL cannot identify it (starts with {head[:16]!r})")]
    except Image.DecompressionBombError as err:
        return None, [("too-large", str(err))]
    except OSError as err:
        kind = "truncated" if "truncated" in str(err).lower() else "corrupt"
        return None, [(kind, str(err))]
    except (ValueError, SyntaxError, EOFError) as err:
        return None, [("corrupt", f"{type(err).__name__}: {err}")]

    issues = []
    m = info["mode"]
    if m == "CMYK":
        issues.append(("cmyk", "CMYK image (print colour space)"))
    elif m in ("RGBA", "LA", "PA", "La", "RGBa") or (m == "P" and transparency):
        issues.append(("rgba", f"mode {m} with an alpha channel"))
    elif m == "P":
        issues.append(("palette", "palette (indexed colour) image"))
    elif m in HIGH_BIT_DEPTH_MODES:
        issues.append(("16-bit", f"mode {m}: more than 8 bits per pixel"))
    elif info["format"] == "PNG" and _png_bit_depth(path) == 16:
        issues.append(("16-bit", f"16-bit {m} PNG: PIL reads the high 8 bits of each channel"))
    elif m in ("L", "1") and mode == "RGB":
        issues.append(("grayscale", f"mode {m}: one channel"))
    elif m not in ("RGB", "L", "1"):
        issues.append(("odd-mode", f"mode {m}"))
    if mode == "L" and m in ("RGB", "CMYK", "RGBA", "P", "YCbCr", "LAB", "HSV"):
        issues.append(("colour", f"mode {m} read as grayscale"))
    short, long = sorted((info["width"], info["height"]))
    if short and long / short > EXTREME_ASPECT:
        issues.append(("extreme-aspect", f"{info['width']}x{info['height']}: the crop keeps {short / long:.0%}"))
    return info, issues


def _png_bit_depth(path: str) -> int | None:
    """Bits per channel from a PNG header (byte 24 of the IHDR chunk); PIL hides 16-bit colour PNGs."""
    with open(path, "rb") as f:
        head = f.read(25)
    if len(head) == 25 and head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        return head[24]
    return None


def _inspect_job(job):
    path, mode, decode = job
    return inspect_image(path, mode, decode)


def _split_folders(root: Path, split: str | None) -> list[tuple[str, Path]]:
    if split is not None:
        if not (root / split).is_dir():
            raise FileNotFoundError(f"split {split!r} not found under {str(root)!r}")
        return [(split, root / split)]
    present = [(s, root / s) for s in SPLIT_NAMES if (root / s).is_dir()]
    return present or [("", root)]


def check_dataset(
    root: str | os.PathLike,
    image_size: int | None = None,
    split: str | None = None,
    mode: str = "RGB",
    decode: bool = True,
    workers: int = 0,
    progress: bool = False,
) -> DatasetReport:
    """Scan an ImageFolder dataset and report counts, sizes and every odd file.

    ``image_size``: the training size; images whose short side is smaller are reported as too small.
    Without it, "too small" means less than half the median short side (an outlier).
    ``split``: check one split only; by default every split folder present (train/val/test) or the root.
    ``decode``: decode every image fully (finds truncated files; slower) or read headers only.
    ``workers``: processes used to decode (0 = this process).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder {str(root)!r} does not exist")
    splits, jobs, ignored, class_lists = _list_files(root, split)
    infos, problems = _read_files(jobs, splits, mode, decode, workers, progress)
    min_size, small = _small_images(infos, image_size)
    problems += small + _folder_problems(root, splits, class_lists)
    widths = [i["width"] for _, i in infos]
    heights = [i["height"] for _, i in infos]
    sizes = {}
    if infos:
        sizes = {
            "width_min": min(widths), "width_median": statistics.median(widths), "width_max": max(widths),
            "height_min": min(heights), "height_median": statistics.median(heights), "height_max": max(heights),
        }
    return DatasetReport(
        root=str(root),
        splits=splits,
        files=len(jobs),
        readable=len(infos),
        sizes=sizes,
        modes=dict(Counter(i["mode"] for _, i in infos).most_common()),
        formats=dict(Counter(i["format"] for _, i in infos).most_common()),
        problems=problems,
        ignored=ignored,
        image_size=image_size,
        min_size=min_size,
        decoded=decode,
    )


def _list_files(root: Path, split: str | None):
    """``(splits, jobs, ignored, class_lists)``: per split a zero count per class, the ``(split, class, path)``
    of every image file, the files that are not images of a class folder, and each split's classes."""
    splits: dict[str, dict[str, int]] = {}
    jobs: list[tuple[str, str, str]] = []
    ignored: list[str] = []
    class_lists: dict[str, list[str]] = {}
    for split_name, folder in _split_folders(root, split):
        classes, class_to_idx = find_classes(folder)
        class_lists[split_name] = classes
        samples, skipped_ext = make_samples(folder, class_to_idx)
        ignored += skipped_ext
        ignored += sorted(str(p) for p in folder.iterdir() if p.is_file())  # files beside the class folders
        splits[split_name] = {c: 0 for c in classes}
        jobs += [(split_name, classes[label], path) for path, label in samples]
    return splits, jobs, ignored, class_lists


def _read_files(jobs: list, splits: dict, mode: str, decode: bool, workers: int, progress: bool):
    """``(infos, problems)``: the ``(path, header facts)`` of every readable file (counted into ``splits``), and
    a :class:`Problem` for every file that is not."""
    iterator = _run_jobs([(p, mode, decode) for _, _, p in jobs], workers)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, total=len(jobs), desc="checking", unit="img")
    infos, problems = [], []
    for (split_name, cls, path), (info, issues) in zip(jobs, iterator):
        for kind, detail in issues:
            problems.append(Problem(path, kind, detail, ACTIONS[kind]))
        if info is not None:
            splits[split_name][cls] += 1
            infos.append((path, info))
    return infos, problems


def _small_images(infos: list, image_size: int | None):
    """``(min_size, problems)``: the short side below which an image is too small (the training size, or half
    the median short side), and a problem for each such image."""
    shorts = [min(i["width"], i["height"]) for _, i in infos]
    min_size = image_size if image_size else (int(statistics.median(shorts)) // 2 if shorts else 0)
    problems = []
    for path, info in infos:
        short = min(info["width"], info["height"])
        if short < min_size:
            problems.append(
                Problem(path, "too-small", f"{info['width']}x{info['height']}, short side < {min_size}",
                        ACTIONS["too-small"])
            )
    return min_size, problems


def _folder_problems(root: Path, splits: dict, class_lists: dict) -> list:
    """Class folders without a readable image, and splits whose classes differ from the first split's."""
    problems = []
    for split_name, counts in splits.items():
        for cls, n in counts.items():
            if n == 0:
                where = os.path.join(root, split_name, cls) if split_name else os.path.join(root, cls)
                problems.append(
                    Problem(where, "empty-class", "no readable image in this class folder", ACTIONS["empty-class"])
                )
    if len(class_lists) > 1:
        names = list(class_lists)
        reference = class_lists[names[0]]
        for other in names[1:]:
            if class_lists[other] != reference:
                extra = sorted(set(class_lists[other]) - set(reference))
                missing = sorted(set(reference) - set(class_lists[other]))
                problems.append(
                    Problem(
                        os.path.join(root, other),
                        "class-mismatch",
                        f"classes differ from {names[0]}/: extra {extra[:5]}, missing {missing[:5]}",
                        ACTIONS["class-mismatch"],
                    )
                )
    return problems


def _run_jobs(jobs, workers):
    if workers and workers > 1 and len(jobs) >= PARALLEL_MIN_FILES:
        import multiprocessing

        # fork starts in milliseconds (spawn re-imports torch in every worker); workers only use PIL
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        pool = multiprocessing.get_context(method).Pool(workers)
        try:
            yield from pool.imap(_inspect_job, jobs, chunksize=64)
        finally:
            pool.terminate()
    else:
        for job in jobs:
            yield _inspect_job(job)


def format_report(report: DatasetReport, max_problems: int = 40) -> str:
    """The human-readable report printed by ``dit-data check``."""
    lines = [f"dataset: {report.root}"]
    for split_name, counts in report.splits.items():
        label = f"split {split_name}/" if split_name else "classes"
        values = list(counts.values())
        summary = f"{len(counts)} classes, {sum(values)} readable images"
        if values:
            summary += f" (per class min {min(values)}, max {max(values)})"
        lines.append(f"  {label}: {summary}")
        if len(counts) <= 20:
            lines.append("    " + ", ".join(f"{c}: {n}" for c, n in counts.items()))
    s = report.sizes
    if s:
        lines.append(
            f"  image sizes: width {s['width_min']}..{s['width_max']} (median {s['width_median']:g}), "
            f"height {s['height_min']}..{s['height_max']} (median {s['height_median']:g})"
        )
    lines.append("  modes: " + ", ".join(f"{m} {n}" for m, n in report.modes.items()))
    lines.append("  formats: " + ", ".join(f"{m} {n}" for m, n in report.formats.items()))
    why = "" if report.image_size else " (half the median)"
    lines.append(f"  too-small threshold: short side < {report.min_size} px{why}")
    if not report.decoded:
        lines.append("  (headers only: truncated files are not detected; run without --quick to decode every image)")
    if report.ignored:
        lines.append(f"  ignored (not image files): {len(report.ignored)}, e.g. {report.ignored[0]}")
    if not report.problems:
        lines.append("no problems found: every image will be read as it is")
        return "\n".join(lines)
    lines.append(f"problems: {len(report.problems)} ({', '.join(f'{k} {n}' for k, n in report.by_kind().items())})")
    for p in report.problems[:max_problems]:
        lines.append(f"  [{p.kind}] {p.path}: {p.detail}")
    if len(report.problems) > max_problems:
        lines.append(f"  ... and {len(report.problems) - max_problems} more (use --json for the full list)")
    lines.append("what the loader does:")
    for kind in report.by_kind():
        lines.append(f"  {kind}: {ACTIONS[kind]}")
    verdict = "OK to train: odd files are converted on the fly" if report.ok else (
        f"{len(report.skipped)} file(s) will be skipped; delete or replace them for an exact count"
    )
    lines.append(verdict)
    return "\n".join(lines)


def _png_16bit_rgb(path: Path, width: int, height: int, seed: int = 0) -> None:
    """Write a 16-bit-per-channel RGB PNG by hand (PIL cannot write one): signature, IHDR, IDAT, IEND."""
    import struct
    import zlib

    import numpy as np

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 65536, size=(height, width, 3), dtype=np.uint16).astype(">u2")  # PNG: big-endian
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)  # filter type 0 before each row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)  # bit depth 16, colour type 2 (RGB)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)


def plant_bad_files(root: str | os.PathLike, size: int = 32, seed: int = 0) -> dict[str, str]:
    """Add one file of every troublesome kind to an ImageFolder dataset, for demonstrations and tests.

    Files go into the class folders under ``root`` (or ``root/train``); returns ``{path: kind}`` with the
    kind the check must report. ``size`` is the training size: the planted images are at least that big,
    except the too-small one. Non-image files planted as well (``notes.txt``, a macOS ``._`` file) are
    not in the returned dict: the loader ignores them.
    """
    import io

    import numpy as np

    root = Path(root)
    folder = root / "train" if (root / "train").is_dir() else root
    classes, _ = find_classes(folder)
    rng = np.random.default_rng(seed)
    big = max(size, 16)

    def noise(h, w, c=3):
        return rng.integers(0, 256, size=(h, w, c) if c > 1 else (h, w), dtype=np.uint8)

    def where(i: int, name: str) -> Path:
        return folder / classes[i % len(classes)] / name

    planted = {}
    p = where(0, "zz_zero_byte.jpg")
    p.write_bytes(b"")
    planted[str(p)] = "zero-byte"

    buf = io.BytesIO()
    Image.fromarray(noise(big * 2, big * 2)).save(buf, format="JPEG", quality=90)
    p = where(1, "zz_truncated.jpg")
    p.write_bytes(buf.getvalue()[: len(buf.getvalue()) * 6 // 10])  # an interrupted download
    planted[str(p)] = "truncated"

    p = where(2, "zz_error_page.jpg")
    p.write_text("<html><body><h1>404 Not Found</h1></body></html>\n")  # a web error page saved as .jpg
    planted[str(p)] = "not-an-image"

    p = where(3, "zz_cmyk.jpg")
    Image.fromarray(noise(big, big)).convert("CMYK").save(p, format="JPEG")
    planted[str(p)] = "cmyk"

    p = where(4, "zz_rgba.png")
    Image.fromarray(noise(big, big, 4)).save(p)  # 4 channels: RGBA
    planted[str(p)] = "rgba"

    p = where(5, "zz_gray.jpg")
    Image.fromarray(noise(big, big, 1)).save(p, format="JPEG")
    planted[str(p)] = "grayscale"

    p = where(6, "zz_16bit_gray.png")
    Image.fromarray(rng.integers(0, 65536, size=(big, big), dtype=np.uint16)).save(p)
    planted[str(p)] = "16-bit"

    p = where(7, "zz_16bit_rgb.png")
    _png_16bit_rgb(p, big, big, seed)
    planted[str(p)] = "16-bit"

    p = where(8, "zz_palette.png")
    Image.fromarray(noise(big, big)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(p)
    planted[str(p)] = "palette"

    p = where(9, "zz_tiny.png")
    Image.fromarray(noise(max(1, size // 4), max(1, size // 4))).save(p)
    planted[str(p)] = "too-small"

    p = where(10, "zz_panorama.png")
    Image.fromarray(noise(big, big * 4)).save(p)
    planted[str(p)] = "extreme-aspect"

    where(0, "notes.txt").write_text("not an image, ignored by extension\n")
    where(1, "._zz_resource_fork.jpg").write_bytes(b"\x00\x05\x16\x07" + bytes(60))  # macOS AppleDouble
    return planted
