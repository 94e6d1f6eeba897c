"""``dit-data``: check an ImageFolder dataset, or export the embedded digits.

    dit-data check ROOT [--image-size 256] [--mode RGB|L] [--split train] [--quick] [--workers N] [--json]
    dit-data digits OUT [--image-size 8] [--val-fraction 0.2] [--seed 0] [--overwrite]
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
    return parser


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
