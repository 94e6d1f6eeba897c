"""``dit-extract-latents``: encode an ImageFolder dataset once with the VAE and store the latents.

    dit-extract-latents --data-path DATA --out LATENTS [--vae stabilityai/sd-vae-ft-ema] [--image-size 256]
                        [--batch-size 32] [--precision fp16] [--verify]
    dit-extract-latents --out LATENTS --verify          # check an existing extraction only

Run the same command again after an interruption: it resumes where it stopped, and the result is the
same as an uninterrupted run. ``--features-path`` (fast-DiT's extraction flag) and ``--feature-path``
(its training flag) are accepted as aliases of ``--out``.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from dit_core.latents import STORAGE_DTYPES
    from dit_core.vae import DEFAULT_VAE
    from dit_core.runtime import DTYPES

    p = argparse.ArgumentParser(
        prog="dit-extract-latents",
        description="pre-extract VAE latents (posterior mean and std, plain and flipped) into a few shards",
    )
    p.add_argument("--data-path", help="ImageFolder dataset (root/<class>/<image> or root/train/<class>/<image>)")
    p.add_argument("--out", "--features-path", "--feature-path", dest="out", required=True,
                   help="output folder for the shards and manifest.json")
    p.add_argument("--vae", default=DEFAULT_VAE,
                   help=f"hub id or local folder of an AutoencoderKL (default {DEFAULT_VAE})")
    p.add_argument("--image-size", type=int, default=256, help="center-crop size in pixels (multiple of 8)")
    p.add_argument("--batch-size", type=int, default=32, help="images per batch (each is encoded plain and flipped)")
    p.add_argument("--precision", choices=tuple(DTYPES), default=None,
                   help="encoder precision (default: fp16 on a GPU, fp32 on the CPU)")
    p.add_argument("--storage-dtype", choices=STORAGE_DTYPES, default="float16",
                   help="dtype of the stored moments (float16 halves the disk space)")
    p.add_argument("--split", default=None, help="split folder to encode (default: train/ if present)")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--num-workers", type=int, default=None, help="image decoding processes")
    p.add_argument("--shard-size", type=int, default=None, help="images per shard (default: about 1 GiB per file)")
    p.add_argument("--no-resume", action="store_true", help="start again instead of resuming an interrupted run")
    p.add_argument("--overwrite", action="store_true", help="replace an extraction made with other settings")
    p.add_argument("--max-batches", type=int, default=None, help="stop after this many batches (resume later)")
    p.add_argument("--verify", action="store_true", help="check shapes, checksums and values afterwards")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from dit_core.atomic import DiskFullError
    from dit_core.latents import LatentFormatError, extract_latents, verify
    from dit_core.vae import VAENotFoundError

    if args.data_path is None and not args.verify:
        print("dit-extract-latents: --data-path is required (or pass --verify alone to check --out)", file=sys.stderr)
        return 2
    if args.data_path is not None:
        try:
            result = extract_latents(
                args.data_path, args.out, vae=args.vae, image_size=args.image_size, batch_size=args.batch_size,
                precision=args.precision, storage_dtype=args.storage_dtype, device=args.device, split=args.split,
                num_workers=args.num_workers, shard_size=args.shard_size, resume=not args.no_resume,
                overwrite=args.overwrite, max_batches=args.max_batches,
            )
        except (VAENotFoundError, LatentFormatError, FileNotFoundError, ValueError, DiskFullError) as err:
            print(f"dit-extract-latents: {err}", file=sys.stderr)
            return 2
        if not result["complete"]:
            print(f"stopped after {result['done']} of {result['count']} images; run the same command to resume")
            return 0
        print(
            f"latents of {result['num_valid']} images ({len(result['skipped'])} skipped) in {args.out}: "
            f"{len(result['shards'])} shard(s), latent shape {result['latent_shape']}, {result['storage_dtype']}, "
            f"encoded in {result['precision']}"
        )
    if args.verify:
        problems = verify(args.out)
        if problems:
            print(f"verify: {len(problems)} problem(s) in {args.out}:", file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
            return 1
        print(f"verify: {args.out} is sound (shapes, checksums, labels and values checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
