"""Data pipeline benchmark: latent extraction throughput, and reading latents vs decoding JPEGs.

    python benchmarks/data_bench.py                       # tiny VAE, 128 synthetic 256 px JPEGs (~1 min on 2 cores)
    python benchmarks/data_bench.py --vae real --images 16  # SD-VAE architecture, random weights (slow on CPU)
    python benchmarks/data_bench.py --vae /path/to/sd-vae-ft-ema --device cuda --images 2048

Prints:
1. extraction: images/s through ``extract_latents`` (each image is encoded twice: plain and mirrored);
2. reading: samples/s of ``LatentDataset`` (memmap read + fresh draw + random flip) against
   ``ImageFolderDataset`` (JPEG decode + ADM center crop + flip), the work a pixel or on-the-fly-VAE
   pipeline repeats at every step, single process and through a DataLoader;
3. disk: bytes per image of the latent shards against the JPEGs;
4. precision: latent error of bf16 / fp16 encoding against fp32, and of float16 storage.

The synthetic JPEGs are smooth random colour fields at ImageNet-like sizes (about 400 x 350), saved at
quality 90; decoding real photographs costs about the same per pixel.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dit_book.bench_data import loader_rate, make_jpegs, rate  # noqa: E402
from dit_core.data import ImageFolderDataset  # noqa: E402
from dit_core.latents import LatentDataset, extract_latents  # noqa: E402
from dit_core.runtime import usable_cores  # noqa: E402
from dit_core.vae import compare_precisions, encode_moments, load_vae, random_vae  # noqa: E402


def make_vae(kind: str):
    """``tiny`` or ``real`` (SD-VAE architecture), both with random weights, or a hub id / local folder."""
    if kind == "tiny":
        return random_vae("tiny"), "tiny (8-16 channels, random weights)"
    if kind == "real":
        return random_vae("sd"), "SD-VAE architecture (128-512 channels, random weights)"
    return load_vae(kind), kind


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--vae", default="tiny", help="tiny | real | a hub id or local folder")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--precision", default=None, help="fp32 | bf16 | fp16 (default: fp16 on GPU, fp32 on CPU)")
    p.add_argument("--device", default=None)
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: usable cores - 1)")
    p.add_argument("--keep", default=None, help="keep the data and latents in this folder")
    args = p.parse_args(argv)

    cores = usable_cores()
    workers = args.workers if args.workers is not None else max(0, cores - 1)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dit-data-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} torch threads, {cores} usable cores")
    try:
        t0 = time.perf_counter()
        jpeg_bytes = make_jpegs(work / "images" / "train", args.images)
        kib = jpeg_bytes / args.images / 1024
        print(f"made {args.images} JPEGs ({kib:.0f} KiB each) in {time.perf_counter() - t0:.1f} s")

        vae, vae_desc = make_vae(args.vae)
        vae = vae.to(device).eval().requires_grad_(False)
        print(f"\n1. extraction ({vae_desc}, {args.image_size} px, batch {args.batch_size}, {workers} loader workers)")
        out = work / "latents"
        if out.exists():
            shutil.rmtree(out)
        t0 = time.perf_counter()
        m = extract_latents(work / "images", out, vae=vae, vae_name=args.vae, image_size=args.image_size,
                            batch_size=args.batch_size, precision=args.precision, device=device,
                            num_workers=workers, progress=False)
        dt = time.perf_counter() - t0
        print(f"   {args.images / dt:8.3g} images/s  ({2 * args.images / dt:.3g} encoder passes/s, plain + mirrored; "
              f"precision {m['precision']}, {dt:.1f} s total)")

        latents = LatentDataset(out)
        pixels = ImageFolderDataset(work / "images", args.image_size)
        n = len(latents)
        rng = np.random.default_rng(0)
        order = rng.permutation(n)
        print("\n2. reading one training sample (single process, random order)")
        lat = rate(lambda i: latents[int(order[i % n])], 2000)
        pix = rate(lambda i: pixels[int(order[i % n])], 50)
        print(f"   LatentDataset        {lat:10.0f} samples/s  (memmap read, fresh draw, random flip)")
        print(f"   ImageFolderDataset   {pix:10.0f} samples/s  (JPEG decode, ADM crop, flip)")
        print(f"   latents are {lat / pix:.0f}x faster to read (and on-the-fly VAE training also encodes each step)")
        bs = min(64, n)
        lat_dl = loader_rate(latents, bs, workers, max(4, 4096 // bs))
        pix_dl = loader_rate(pixels, bs, workers, max(2, 256 // bs))
        print(f"   through a DataLoader (batch {bs}, {workers} workers): latents {lat_dl:.0f}/s, JPEGs {pix_dl:.0f}/s")

        shard_bytes = sum(f.stat().st_size for f in out.glob("*.npy"))
        print("\n3. disk")
        print(f"   latents: {shard_bytes / n / 1024:.1f} KiB per image (mean + std, plain + mirrored, "
              f"{m['storage_dtype']}, {len(m['shards'])} shard(s)); JPEGs: {jpeg_bytes / n / 1024:.1f} KiB per image")
        per_image = shard_bytes / n
        print(f"   ImageNet (1,281,167 images) would need {per_image * 1281167 / 1024**3:.1f} GiB of latents")

        print("\n4. precision (latent mean; rel_rms = rms error / rms value)")
        x = torch.stack([pixels.load(i)[0] for i in range(min(4, n))]).to(device)
        for prec, err in compare_precisions(vae, x).items():
            print(f"   {prec} encoding vs fp32: rel_rms {err['rel_rms']:.2e}, max_abs {err['max_abs']:.2e}, "
                  f"rms error / rms posterior std {err['vs_std']:.2e}")
        k = min(4, n)
        ref, _ = encode_moments(vae, torch.cat([x, x.flip(-1)]), "fp32", m["scale"])  # (2k, C, h, w)
        ref = ref.view(2, k, *m["latent_shape"]).transpose(0, 1).cpu().numpy()
        stored = np.load(out / m["shards"][0]["mean"], mmap_mode="r")[:k].astype(np.float32)
        if m["precision"] == "fp32":
            rel = np.sqrt(np.mean((stored - ref) ** 2)) / np.sqrt(np.mean(ref**2))
            print(f"   {m['storage_dtype']} storage vs fp32 encoding: rel_rms {rel:.2e} "
                  f"(float16 rounds to 2^-11 = {2.0**-11:.1e})")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
