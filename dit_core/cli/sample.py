"""``dit-sample``: class-conditional images from a DiT checkpoint, as a labelled grid and/or an FID ``.npz``.

    dit-sample --ckpt runs/digits --grid samples.png                        # the run's own sampling settings
    dit-sample --ckpt DiT-XL-2-256x256.pt --classes 207,360,387,974 --per-class 2 --cfg-scale 4 \\
               --steps 250 --sampler ddpm --grid xl.png                      # official checkpoint, SD VAE
    dit-sample --ckpt DiT-XL-2-256x256.pt --classes 0-999 --per-class 50 --cfg-scale 1.5 \\
               --guidance-channels 3 --npz fid50k.npz --batch-size 125     # the paper's FID-50K samples

``--ckpt`` takes a dit_core run folder or checkpoint, an official ``.pt``, or a diffusers DiTPipeline folder.
Unset sampling options come from the checkpoint's run (digits: ddim, 50 steps, cfg 2), else the official
defaults (ddpm, 250 steps, cfg 4). Prints the images/s of the sampling itself (model loading excluded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dit-sample", description=__doc__.splitlines()[0].strip("`: "),
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--ckpt", required=True, help="run folder, checkpoint (.pt/.safetensors) or diffusers folder")
    p.add_argument("--classes", default=None, help="classes to sample, e.g. '0-9,12' (default: up to the first 10)")
    p.add_argument("--per-class", type=int, default=4, help="samples per class (default 4)")
    p.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (1: none)")
    p.add_argument("--guidance-channels", type=int, default=None,
                   help="guide only the first K noise channels (3: the official sampler; default: all)")
    p.add_argument("--sampler", default=None, help="ddpm, ddim or dpm-solver++; a flow model: euler (= ddim), heun "
                                                  "or euler-maruyama")
    p.add_argument("--steps", type=int, default=None, help="sampling steps (ddpm 250, ddim 50, dpm-solver++ 25)")
    p.add_argument("--eta", type=float, default=0.0, help="DDIM noise (0: deterministic)")
    p.add_argument("--seed", type=int, default=0, help="sample i uses seed + i, whatever the batch size")
    p.add_argument("--vae", default=None, help="VAE id or folder for latent models (default: the checkpoint's)")
    p.add_argument("--batch-size", type=int, default=None, help="images per forward pass (default 64 on CPU, 128 on GPU)")
    p.add_argument("--decode-batch-size", type=int, default=None, help="images per VAE decode (default: batch size)")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="autocast of the transformer (auto: bf16 on bf16 GPUs and AMX CPUs)")
    p.add_argument("--device", default="auto", help="cuda, cpu, cuda:1, mps or auto")
    p.add_argument("--grid", default=None, help="write a labelled PNG grid here (one row per class)")
    p.add_argument("--npz", default=None, help="write arr_0 (uint8 NxHxWxC) and labels here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from dit_core.diffusion import create_process
    from dit_core.runtime import resolve_device, resolve_precision, set_threads
    from dit_core.sample import generate, load_model, parse_classes, save_grid, save_npz

    if not (args.grid or args.npz):
        print("dit-sample: nothing to write; pass --grid out.png and/or --npz out.npz", file=sys.stderr)
        return 2
    if args.per_class < 1:
        print("dit-sample: --per-class must be at least 1", file=sys.stderr)
        return 2
    set_threads()
    try:
        device = resolve_device(args.device)
        amp = resolve_precision(args.precision, device)
    except ValueError as err:
        print(f"dit-sample: {err}", file=sys.stderr)
        return 2
    try:
        model, info = load_model(args.ckpt, device=device)
    except (FileNotFoundError, ValueError) as err:
        print(f"dit-sample: {err}", file=sys.stderr)
        return 2
    num_classes = model.num_classes
    try:
        if args.classes is not None:
            classes = parse_classes(args.classes, num_classes or 1)
        else:
            classes = list(range(min(10, num_classes))) if num_classes else [0]
    except ValueError as err:
        print(f"dit-sample: {err}", file=sys.stderr)
        return 2
    labels = [c for c in classes for _ in range(args.per_class)]
    sampler = args.sampler or info.get("sampler") or "ddpm"
    steps = args.steps or (info.get("steps") if sampler == info.get("sampler") else None) or \
        {"ddpm": 250, "ddim": 50, "euler": 50, "euler-maruyama": 250}.get(sampler, 25)
    cfg_scale = args.cfg_scale if args.cfg_scale is not None else (info.get("cfg_scale") or 4.0)
    if not num_classes:
        cfg_scale = 1.0

    vae = None
    if info.get("space") == "latent":
        from dit_core.runtime import DTYPES
        from dit_core.vae import VAENotFoundError, load_vae

        name = args.vae or info.get("vae")
        try:
            # the decoder's weights in the VAE's precision: fp16 on a GPU, fp32 elsewhere
            vae = load_vae(name, device=device, dtype=DTYPES[resolve_precision("auto", device, "vae")])
        except (VAENotFoundError, OSError, ValueError) as err:
            print(f"dit-sample: this is a latent model and its VAE cannot be loaded: {err}", file=sys.stderr)
            return 2
    # DiT's diffusion, or the linear interpolant of a flow model (sampled with euler, heun or euler-maruyama)
    diffusion = create_process(info.get("objective", "ddpm"), noise_schedule=info.get("noise_schedule", "linear"),
                               learn_sigma=model.learn_sigma, diffusion_steps=info.get("diffusion_steps", 1000))
    batch_size = args.batch_size or (128 if device.type == "cuda" else 64)

    start = time.perf_counter()
    try:
        images = generate(model, diffusion, labels, cfg_scale=cfg_scale, sampler=sampler, steps=steps, seed=args.seed,
                          device=device, batch_size=batch_size, guidance_channels=args.guidance_channels, eta=args.eta,
                          amp=amp, progress=not args.no_progress, vae=vae, decode_batch_size=args.decode_batch_size)
    except ValueError as err:
        print(f"dit-sample: {err}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start

    names = info.get("label_names")
    shown = [names[c] if names and c < len(names) else str(c) for c in labels]
    summary = dict(ckpt=str(args.ckpt), kind=info.get("kind"), images=len(labels), classes=classes,
                   per_class=args.per_class, sampler=sampler, steps=steps, cfg_scale=cfg_scale,
                   guidance_channels=args.guidance_channels, eta=args.eta, seed=args.seed, precision=amp,
                   device=str(device), batch_size=batch_size, seconds=round(seconds, 3),
                   images_per_second=round(len(labels) / seconds, 3) if seconds > 0 else None,
                   shape=list(images.shape[1:]))
    if args.grid:
        save_grid(images, args.grid, nrow=args.per_class if len(classes) > 1 else None, labels=shown)
        summary["grid"] = args.grid
    if args.npz:
        summary["npz"] = str(save_npz(args.npz, images, labels))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{len(labels)} images ({sampler}, {steps} steps, cfg {cfg_scale}, {amp}, {device}) in {seconds:.2f} s: "
              f"{summary['images_per_second']} images/s" + "".join(
                  f"; {k} -> {summary[k]}" for k in ("grid", "npz") if k in summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
