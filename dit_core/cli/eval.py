"""``dit-eval``: how good are the samples? FID, or the digits metrics.

    dit-eval samples.npz --digits                                # digits: class accuracy + Fréchet distance
    dit-eval samples.npz reference.npz --inception pt_inception-2015-12-05-6726825d.pth     # FID, two sets
    dit-eval samples.npz VIRTUAL_imagenet256_labeled.npz --inception ...   # its 10k images, our network
    dit-eval samples.npz VIRTUAL_imagenet256_labeled.npz --inception ... --reference-stats stored  # ADM's mu/sigma
    dit-eval real_images/ --inception ... --save-stats ref_stats.npz        # compute reference statistics

Sample sets are ``.npz`` files with ``arr_0`` (what ``dit-sample --npz`` writes), ``.npy`` arrays or image
folders; a reference may also be an ``.npz`` holding ``mu`` and ``sigma``. The Inception weights are read from
a local file only (``--inception`` or ``$DIT_INCEPTION``). An ``.npz`` is read in chunks: 50,000 samples never
sit in memory.

Which statistics a reference gives (``--reference-stats``): ``auto`` (default) computes them from its images
with the same network as the samples whenever it has images (ADM's VIRTUAL_imagenet256_labeled.npz has 10,000),
and uses stored ``mu``/``sigma`` only when it has none; ``stored`` uses stored ``mu``/``sigma`` (ADM's are from
TensorFlow's Inception graph over the whole ImageNet training set: the FID then mixes two implementations of the
network, and the output says so); ``images`` insists on images.
"""

from __future__ import annotations

import argparse
import json
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dit-eval", description=__doc__.splitlines()[0].strip("`: "),
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("samples", help=".npz (arr_0, labels), .npy or image folder")
    p.add_argument("reference", nargs="?", default=None, help="second set, or .npz with mu/sigma (FID)")
    p.add_argument("--digits", action="store_true", help="digits metrics (no Inception needed)")
    p.add_argument("--digits-reference", default="train", choices=["train", "val", "all"],
                   help="real digits the Fréchet distance compares with (default: train)")
    p.add_argument("--inception", default=None, help="path of pt_inception-2015-12-05-6726825d.pth")
    p.add_argument("--batch-size", type=int, default=50, help="images per Inception forward pass")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--save-stats", default=None, help="save mu/sigma of the samples (one set) or of the reference")
    p.add_argument("--reference-stats", default="auto", choices=["auto", "images", "stored"],
                   help="reference statistics from its images (auto: when it has them) or its stored mu/sigma")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from dit_core.eval import digits, fid, inception, samples

    if args.digits:
        try:
            images, labels = samples.load_images(args.samples)
        except (FileNotFoundError, ValueError) as err:
            print(f"dit-eval: {err}", file=sys.stderr)
            return 2
        result = digits.digits_metrics(images, labels, reference=args.digits_reference)
        result["samples"] = args.samples
        if labels is None:
            result["note"] = "no labels in the sample file: class accuracy skipped"
        _report(result, args.json, ("class_accuracy", "frechet_distance", "real_floor", "classifier_val_accuracy",
                                    "num_samples"))
        return 0

    from dit_core.runtime import resolve_device, set_threads

    try:  # the first images only: a bad file fails here, before any network is loaded
        first = next(samples.iter_images(args.samples, chunk=1), None) if fid.load_statistics(args.samples) is None \
            else None
    except (FileNotFoundError, ValueError) as err:
        print(f"dit-eval: {err}", file=sys.stderr)
        return 2
    if args.reference is None and not args.save_stats:
        print("dit-eval: one set and no --save-stats: pass a reference to compute FID, or --save-stats "
              "PATH to keep this set's statistics", file=sys.stderr)
        return 2
    set_threads()
    device = resolve_device(args.device)
    try:
        model = inception.load_inception(args.inception, device)
    except (FileNotFoundError, ValueError) as err:
        hint = ""
        if first is not None and first.shape[1] <= 32 and first.shape[-1] == 1:
            hint = "\n(these look like digits: `dit-eval SAMPLES --digits` needs no Inception network)"
        print(f"dit-eval: {err}{hint}", file=sys.stderr)
        return 2
    if args.reference is None:  # one set: its statistics only
        mu, sigma, n = fid.image_statistics(args.samples, model, args.batch_size, device, progress=True)
        fid.save_statistics(args.save_stats, mu, sigma, n)
        _report({"num_samples": n, "saved_stats": args.save_stats}, args.json, ("num_samples", "saved_stats"))
        return 0
    try:
        result = fid.fid(args.samples, args.reference, inception=model, batch_size=args.batch_size, device=device,
                         progress=True, save_reference_stats=args.save_stats, reference_stats=args.reference_stats)
    except (FileNotFoundError, ValueError) as err:
        print(f"dit-eval: {err}", file=sys.stderr)
        return 2
    result.update(samples=args.samples, reference=args.reference)
    if result["num_samples"] is not None and result["num_samples"] < 2048:
        result["note"] = (f"only {result['num_samples']} samples: FID is biased upwards for small sets; the paper "
                          "uses 50,000")
    _report(result, args.json, ("fid", "num_samples", "num_reference", "reference_statistics"))
    return 0


def _report(result: dict, as_json: bool, keys) -> None:
    if as_json:
        print(json.dumps(result, indent=2, default=float))
        return
    for k in keys:
        if k in result:
            v = result[k]
            print(f"{k:>24}: {v:.4f}" if isinstance(v, float) else f"{k:>24}: {v}")
    if "per_class_accuracy" in result:
        print(f"{'per_class_accuracy':>24}: " + " ".join(f"{c}:{a:.2f}" for c, a in result["per_class_accuracy"].items()))
    for note in ([result["note"]] if "note" in result else []) + list(result.get("notes", [])):
        print(f"note: {note}")


if __name__ == "__main__":
    sys.exit(main())
