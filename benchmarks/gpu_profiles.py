"""Train each GPU profile of ``dit-train`` for a few steps on this GPU and report what the trainer measured.

The profiles (``dit_core/configs/*.yaml``) promise that DiT-XL/2 with the paper's recipe fits a card of their
size. This script checks that on one large GPU: it caps the CUDA allocator at each profile's card size
(``torch.cuda.set_per_process_memory_fraction``), runs the real trainer (data loader, bf16, accumulation,
EMA, checkpoint) for ``--steps`` steps on synthetic 256 px latents, and prints images/s and the peak memory
from the run's ``summary.json``. The latents come from random images encoded by a randomly initialised VAE
of Stable Diffusion's architecture (nothing is downloaded), so the loss means nothing; speed and memory do.

    python benchmarks/gpu_profiles.py                       # all GPU profiles, 30 steps each
    python benchmarks/gpu_profiles.py --profiles h100-80gb --steps 50

Writes ``<out>/profiles.json``; about a minute per profile on an H100-class card.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: card size of each profile, GiB as the allocator counts it (an "80 GB" card shows ~79.2 GiB)
CARDS = {"rtx3060-12gb": 11.6, "rtx3090-24gb": 23.6, "a100-40gb": 39.4, "a100-80gb": 79.2, "h100-80gb": 79.2}


def make_latents(root: Path, images: int, size: int = 256, classes: int = 10) -> Path:
    """Random images in ``classes`` folders, encoded once by a random-init SD-architecture VAE."""
    import numpy as np
    import torch
    from diffusers import AutoencoderKL
    from PIL import Image

    from dit_core.vae import SD_VAE_CONFIG
    from dit_core.latents import extract_latents

    out = root / "latents"
    if (out / "manifest.json").exists():
        return out
    rng = np.random.default_rng(0)
    for i in range(images):
        folder = root / "images" / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i:05d}.png")
    torch.manual_seed(0)
    AutoencoderKL(**SD_VAE_CONFIG).save_pretrained(root / "vae")
    result = extract_latents(root / "images", out, vae=str(root / "vae"), image_size=size, batch_size=64,
                             num_workers=4, progress=False)
    assert result["complete"], result
    return out


def child(profile: str, latents: str, out: str, steps: int, limit_gib: float | None) -> None:
    """One profile in this process (a fresh one, so that its peak memory is its own)."""
    import torch

    from dit_core.train.config import make_config
    from dit_core.train.loop import train

    if limit_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit_gib * 2**30 / total))
    cfg = make_config(profile, dict(latents_path=latents, out=out, max_steps=steps, log_every=10,
                                    ckpt_every=steps, sample_every=0, sample_at_end=False, tensorboard=False,
                                    progress=False, num_workers=4))
    train(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", nargs="+", default=["h100-80gb", "a100-40gb", "rtx3090-24gb"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--out", default="runs/gpu-profiles")
    ap.add_argument("--no-limit", action="store_true", help="do not cap the allocator at the profile's card size")
    ap.add_argument("--child", nargs=5, metavar=("PROFILE", "LATENTS", "OUT", "STEPS", "LIMIT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        p, lat, out, steps, limit = args.child
        return child(p, lat, out, int(steps), float(limit) or None)

    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_profiles.py needs a CUDA GPU (the profiles are GPU settings; the CPU one is `--config digits`)")
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    start = time.time()
    latents = make_latents(root, args.images)
    print(f"latents: {args.images} synthetic 256 px images in {time.time() - start:.0f} s", flush=True)
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    rows = []
    for profile in args.profiles:
        limit = 0.0 if args.no_limit else min(CARDS.get(profile, total), total)
        out = root / profile
        t0 = time.time()
        proc = subprocess.run([sys.executable, __file__, "--child", profile, str(latents), str(out), str(args.steps),
                               str(limit)], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        row = dict(profile=profile, limit_gib=limit or None, wall_s=round(time.time() - t0, 1))
        summary = out / "summary.json"
        if proc.returncode == 0 and summary.exists():
            s = json.loads(summary.read_text())
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            row.update(status="ok", images_per_s=s["images_per_s"], peak_memory_gb=s["peak_memory_gb"],
                       final_loss=s["final_loss"], precision=s["precision"],
                       # the last logging interval: start-up and the first steps' kernel choices excluded
                       steady_images_per_s=records[-1]["images_per_s"] if records else None)
        else:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-4:]
            row.update(status="OOM" if "out of memory" in proc.stderr.lower() else "error", detail=" | ".join(tail)[-400:])
        rows.append(row)
        print(json.dumps(row), flush=True)
    gpu = torch.cuda.get_device_name(0)
    lines = [f"DiT-XL/2 profiles of dit-train, {args.steps} steps each on {gpu} (allocator capped at the card size):",
             f"{'profile':<16}{'cap GiB':>9}{'img/s run':>11}{'img/s last 10':>15}{'peak GiB':>10}  status"]
    for r in rows:
        lines.append(f"{r['profile']:<16}{(r['limit_gib'] or 0):>9.1f}{r.get('images_per_s', 0):>11.1f}"
                     f"{r.get('steady_images_per_s') or 0:>15.1f}{r.get('peak_memory_gb', 0):>10.2f}  {r['status']}")
    table = "\n".join(lines)
    print("\n" + table)
    (root / "profiles.json").write_text(json.dumps(dict(gpu=gpu, steps=args.steps, rows=rows, table=table), indent=1))


if __name__ == "__main__":
    main()
