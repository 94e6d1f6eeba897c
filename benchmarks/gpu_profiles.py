"""Train each GPU profile of ``dit-train`` for a few steps on this GPU and report what the trainer measured.

The profiles (``dit_core/configs/*.yaml``) promise that DiT-XL/2 with the paper's recipe fits a card of their
size, and the book's GPU-track profiles (DiT-B/2 on Imagenette) that chapter 05 fits the reader's card with the
memory planner's micro-batch. This script checks that on one large GPU: it caps the CUDA allocator at each
profile's card size (:data:`CARDS`; for the GPU-track profiles, with the planner's setup for that size)
via ``torch.cuda.set_per_process_memory_fraction``, runs the real trainer (data loader, bf16, accumulation,
EMA, checkpoint) for ``--steps`` steps on synthetic 256 px latents, and prints images/s and the peak memory
from the run's ``summary.json``. The latents come from random images encoded by a randomly initialised VAE
of Stable Diffusion's architecture (nothing is downloaded), so the loss means nothing; speed and memory do.

    python benchmarks/gpu_profiles.py                       # the DiT-XL/2 GPU profiles, 30 steps each
    python benchmarks/gpu_profiles.py --profiles imagenette-b2 imagenette-b2-fp16   # the book's GPU track, planned
    python benchmarks/gpu_profiles.py --profiles rtx3060-12gb --steps 20 --json benchmarks/results/x.json
    python benchmarks/gpu_profiles.py --dry-run              # on a CPU: a tiny model with each profile's settings

``rtx3060-12gb`` needs bitsandbytes (8-bit AdamW): ``pip install -e ".[lowmem]"``. Writes
``<out>/profiles.json`` (and ``--json``) after each profile; about a minute per profile on an H100-class card.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def child_env() -> dict:
    """The environment of a part's process: this one's, with the repository put first on ``PYTHONPATH`` and the
    caller's entries kept after it (carried wheels, e.g. bitsandbytes or diffusers installed with ``--target``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env

#: card size of each profile, GiB as the allocator counts it (an "80 GB" card shows ~79.2 GiB; the 12 GB cap
#: is below 12 GiB, as torch reports a 12 GB card, so a profile that runs here fits the real card). The book's
#: GPU-track profiles run on the reader's card: ``imagenette-b2`` is checked on the smallest card of the book's
#: range (12 GB, bf16: an RTX 3060), ``imagenette-b2-fp16`` on a 16 GB card without bf16 (a T4 or a 16 GB V100;
#: 14.5 GiB is a cap chosen below what such a card shows with ECC on, not a measured size).
CARDS = {"rtx3060-12gb": 11.6, "rtx3090-24gb": 23.6, "a100-40gb": 39.4, "a100-80gb": 79.2, "h100-80gb": 79.2,
         "imagenette-b2": 11.6, "imagenette-b2-fp16": 14.5}
#: profiles whose micro-batch and checkpointing chapter 05 takes from the memory planner for the card it runs on
#: (``dit_book.track.planned_batch``); here the planner is asked for the cap, as the chapter would be
PLANNED = ("imagenette-b2", "imagenette-b2-fp16")
#: --dry-run: each profile's settings on a tiny model, on the CPU (checks this script and the settings)
DRY = dict(depth=2, hidden_size=64, num_heads=2, batch_size=8, grad_accum=2, device="cpu", num_workers=0)


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
                             num_workers=4 if images > 64 else 0, progress=False)
    assert result["complete"], result
    return out


def planned_overrides(profile: str, limit_gib: float) -> dict:
    """The planner's micro-batch and checkpointing for ``profile`` on a card of ``limit_gib``, as chapter 05 asks
    for them (empty for the profiles that fix their own)."""
    if profile not in PLANNED or not limit_gib:
        return {}
    from dit_book.track import planned_batch
    from dit_core.train.config import make_config

    cfg = make_config(profile)
    plan = planned_batch(cfg.model, limit_gib, cfg.mixed_precision, image_size=cfg.image_size,
                         global_batch=cfg.batch_size)
    return {"grad_accum": plan["grad_accum"], "grad_checkpointing": plan["grad_checkpointing"],
            "planned_peak_gib": plan["planned_peak_gib"]}


def child(profile: str, latents: str, out: str, steps: int, limit_gib: float | None, dry: bool = False,
          image_size: int = 256, extra: dict | None = None) -> None:
    """One profile in this process (a fresh one, so that its peak memory is its own)."""
    import torch

    from dit_core.train.config import make_config
    from dit_core.train.loop import train

    if limit_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit_gib * 2**30 / total))
    overrides = dict(latents_path=latents, out=out, max_steps=steps, log_every=min(10, steps), ckpt_every=steps,
                     sample_every=0, sample_at_end=False, tensorboard=False, progress=False, num_workers=4,
                     image_size=image_size)
    extra = {k: v for k, v in (extra or {}).items() if k != "planned_peak_gib"}
    cfg = make_config(profile, dict(overrides, **extra, **(DRY if dry else {})))
    train(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", nargs="+", default=["rtx3060-12gb", "rtx3090-24gb", "a100-40gb", "h100-80gb"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--out", default="runs/gpu-profiles")
    ap.add_argument("--json", default=None, help="also write the rows and the table to this file")
    ap.add_argument("--no-limit", action="store_true", help="do not cap the allocator at the profile's card size")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU: a tiny model, 32 px, no cap")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per profile")
    ap.add_argument("--child", nargs=8, metavar=("PROFILE", "LATENTS", "OUT", "STEPS", "LIMIT", "DRY", "SIZE", "EXTRA"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        p, lat, out, steps, limit, dry, size, extra = args.child
        return child(p, lat, out, int(steps), float(limit) or None, dry == "1", int(size), json.loads(extra))

    import torch

    if not (torch.cuda.is_available() or args.dry_run):
        sys.exit("gpu_profiles.py needs a CUDA GPU (the profiles are GPU settings; the CPU one is `--config digits`); "
                 "--dry-run checks the script on a CPU")
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    start = time.time()
    size = 32 if args.dry_run else 256
    images = min(args.images, 16) if args.dry_run else args.images
    latents = make_latents(root, images, size=size)
    print(f"latents: {images} synthetic {size} px images in {time.time() - start:.0f} s", flush=True)
    total = torch.cuda.get_device_properties(0).total_memory / 2**30 if not args.dry_run else 0.0
    rows = []
    gpu = torch.cuda.get_device_name(0) if not args.dry_run else "CPU (dry run: a tiny model with the profiles' settings)"

    def save() -> None:  # after each profile, so that a run cut short keeps what it measured
        lines = [f"Profiles of dit-train, {args.steps} steps each on {gpu} (allocator capped at the card size):",
                 f"{'profile':<20}{'cap GiB':>9}{'img/s run':>11}{'img/s last 10':>15}{'peak GiB':>10}  status"]
        for r in rows:
            plan = r.get("planner")
            setup = (f" (planner: {plan['grad_accum']} micro-batches, {plan['grad_checkpointing']} blocks checkpointed)"
                     if plan else "")
            lines.append(f"{r['profile']:<20}{(r['limit_gib'] or 0):>9.1f}{r.get('images_per_s', 0):>11.1f}"
                         f"{r.get('steady_images_per_s') or 0:>15.1f}{r.get('peak_memory_gb', 0):>10.2f}  {r['status']}{setup}")
        table = "\n".join(lines)
        record = json.dumps(dict(gpu=gpu, steps=args.steps, rows=rows, table=table), indent=1)
        (root / "profiles.json").write_text(record)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(record)
        return table

    for profile in args.profiles:
        limit = 0.0 if args.no_limit or args.dry_run else min(CARDS.get(profile, total), total)
        out = root / profile
        shutil.rmtree(out, ignore_errors=True)  # a fresh run: an earlier one's checkpoint would be resumed
        t0 = time.time()
        extra = planned_overrides(profile, limit)
        cmd = [sys.executable, __file__, "--child", profile, str(latents), str(out), str(args.steps), str(limit),
               "1" if args.dry_run else "0", str(size), json.dumps(extra)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=child_env())
        except subprocess.TimeoutExpired as err:
            proc = subprocess.CompletedProcess(cmd, 124, (err.stdout or b"").decode(errors="replace")
                                               if isinstance(err.stdout, bytes) else (err.stdout or ""),
                                               f"timed out after {args.timeout:g} s")
        row = dict(profile=profile, limit_gib=limit or None, wall_s=round(time.time() - t0, 1), dry_run=args.dry_run,
                   **({"planner": extra} if extra else {}))
        summary = out / "summary.json"
        if proc.returncode == 0 and summary.exists():
            s = json.loads(summary.read_text())
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            row.update(status="ok", images_per_s=s["images_per_s"], peak_memory_gb=s["peak_memory_gb"],
                       final_loss=s["final_loss"], precision=s["precision"], steps=s["steps"],
                       # the last logging interval: start-up and the first steps' kernel choices excluded
                       steady_images_per_s=records[-1]["images_per_s"] if records else None)
        else:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-4:]
            row.update(status="OOM" if "out of memory" in (proc.stderr or "").lower() else
                       ("timeout" if proc.returncode == 124 else "error"), detail=" | ".join(tail)[-400:])
        rows.append(row)
        print(json.dumps(row), flush=True)
        save()
    print("\n" + save())


if __name__ == "__main__":
    main()
