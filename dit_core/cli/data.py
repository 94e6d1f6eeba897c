"""``dit-data``: check an ImageFolder dataset, export the embedded digits, write a shapes folder, or prepare Imagenette.

    dit-data check ROOT [--image-size 256] [--mode RGB|L] [--split train] [--quick] [--workers N] [--json]
    dit-data digits OUT [--image-size 8] [--val-fraction 0.2] [--seed 0] [--overwrite]
    dit-data shapes OUT [--per-class 300] [--classes circle,square,triangle] [--seed 0] [--grayscale] [--rotation upright|any]
    dit-data bench OUT [--kind glyphs|shapes|textures] [--seed 0] [--per-class 300]
    dit-data imagenette OUT [--archive imagenette2-320.tgz] [--cache DIR] [--no-download]

``dit-data shapes`` writes a folder of coloured shapes (one sub-folder per shape, files of varied size and format;
:mod:`dit_core.data.shapes`): a stand-in for a reader's own small images, with a judge that scores samples of it
(``python -m dit_core.eval.shapes RUN``).

``dit-data bench`` writes one folder of the test bench (:mod:`dit_core.data.bench`): letters, shapes or textures in
files wider or taller than square, objects small and off-centre, classes that change when mirrored; its judge is
:mod:`dit_core.eval.bench`.

``dit-data imagenette`` is a download by name: it fetches ``imagenette2-320.tgz`` (342 MB) into the cache
(``$DIT_CACHE``, default ``~/.cache/dit-one-gpu``) unless ``--archive`` or the cache already has it, checks its
size and sha256, and writes an ImageFolder whose labels are the classes' ImageNet-1k indices (``label_map.json``).
"""

from __future__ import annotations

import argparse
import json
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dit-data", description=__doc__.splitlines()[0].replace("`", ""))
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="scan a dataset: class counts, sizes, and every odd or broken file")
    check.add_argument("root", help="dataset folder: root/<class>/<image> or root/{train,val}/<class>/<image>")
    check.add_argument("--image-size", type=int, default=None, help="training size; smaller images are reported")
    check.add_argument("--mode", choices=("RGB", "L"), default="RGB", help="how the images will be read (L: grayscale)")
    check.add_argument("--split", default=None, help="check one split folder only (default: all present)")
    check.add_argument("--quick", action="store_true", help="read headers only (fast; misses truncated files)")
    check.add_argument("--workers", type=int, default=None, help="decoding processes (default: usable cores)")
    check.add_argument("--json", action="store_true", help="print the full report as JSON")
    check.add_argument("--strict", action="store_true", help="exit with status 1 if any file would be skipped")

    digits = sub.add_parser("digits", help="export scikit-learn's handwritten digits as an ImageFolder (no download)")
    digits.add_argument("out", help="output folder (created; left alone if already exported with the same settings)")
    digits.add_argument("--image-size", type=int, default=None, help="upsample the 8x8 digits to this size (bicubic)")
    digits.add_argument("--val-fraction", type=float, default=0.2, help="share of each class put in val/")
    digits.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    digits.add_argument("--overwrite", action="store_true", help="replace an export made with other settings")
    shapes = sub.add_parser("shapes", help="write a folder of coloured shapes in varied sizes and file formats (a "
                                           "stand-in for your own small images; no download)")
    from dit_core.data.shapes import add_arguments

    add_arguments(shapes)
    bench = sub.add_parser("bench", help="write a folder of the test bench: letters, shapes or textures in non-square "
                                         "files, off-centre objects, classes that change when mirrored (no download)")
    from dit_core.data.bench import add_arguments as bench_arguments

    bench_arguments(bench)
    nette = sub.add_parser("imagenette", help="download (or take) Imagenette and write it as an ImageFolder with "
                                               "ImageNet-1k labels")
    nette.add_argument("out", help="output folder (written whole at the end; an existing complete one is kept)")
    nette.add_argument("--archive", default=None, help="a local imagenette2-320.tgz instead of the download")
    nette.add_argument("--cache", default=None, help="download folder (default $DIT_CACHE or ~/.cache/dit-one-gpu)")
    nette.add_argument("--url", default=None, help="fetch the archive from this URL instead (a mirror; file:// works)")
    nette.add_argument("--no-download", action="store_true", help="use --archive or the cache only; never download")
    nette.add_argument("--no-checksum", action="store_true",
                       help="accept an archive that is not the published file (one you made in the same layout)")
    nette.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def _imagenette(args) -> int:
    from dit_core.data.imagenette import prepare_imagenette
    from dit_core.downloads import DownloadError

    try:
        out = prepare_imagenette(args.out, archive=args.archive, download=not args.no_download, cache=args.cache,
                                 url=args.url, checksum=not args.no_checksum, progress=not args.no_progress)
    except (DownloadError, FileExistsError, ValueError) as err:
        print(f"dit-data imagenette: {err}", file=sys.stderr)
        return 2
    manifest = json.loads((out / "imagenette.json").read_text())
    counts = manifest["counts"]
    print(f"Imagenette in {out}: {counts['train']} train, {counts['val']} val images, 10 classes labelled with their "
          f"ImageNet-1k indices out of 1000 (label_map.json)")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "check":
        from dit_core.data.check import check_dataset, format_report

        workers = args.workers
        if workers is None:
            from dit_core.runtime import usable_cores

            workers = usable_cores()
        try:
            report = check_dataset(
                args.root, image_size=args.image_size, split=args.split, mode=args.mode,
                decode=not args.quick, workers=workers, progress=not args.json,
            )
        except FileNotFoundError as err:
            print(f"dit-data check: {err}", file=sys.stderr)
            return 2
        print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
        return 1 if (args.strict and not report.ok) else 0

    if args.command == "imagenette":
        return _imagenette(args)
    if args.command == "shapes":
        from dit_core.data.shapes import run

        return run(args)
    if args.command == "bench":
        from dit_core.data.bench import run as bench_run

        return bench_run(args)

    from dit_core.data.digits import export_digits

    try:
        out = export_digits(args.out, image_size=args.image_size, val_fraction=args.val_fraction,
                            seed=args.seed, overwrite=args.overwrite)
    except (FileExistsError, ValueError) as err:
        print(f"dit-data digits: {err}", file=sys.stderr)
        return 2
    manifest = json.loads((out / "digits.json").read_text())
    counts = {split: sum(c.values()) for split, c in manifest["counts"].items()}
    print(f"digits in {out}: {counts['train']} train, {counts['val']} val images, 10 classes "
          f"({manifest['image_size'] or 8}x{manifest['image_size'] or 8} PNG)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
