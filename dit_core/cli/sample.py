"""``dit-sample``: class-conditional images from a DiT checkpoint, as a labelled grid and/or an FID ``.npz``.

    dit-sample --ckpt runs/digits --grid samples.png                        # the run's own sampling settings
    dit-sample --ckpt DiT-XL-2-256x256.pt --classes 207,360,387,974 --per-class 2 --grid xl.png
                                             # an official checkpoint: the official sample.py's settings
    dit-sample --ckpt DiT-XL-2-256x256.pt --official --npz fid50k.npz       # the FID-50K samples of the paper
    torchrun --nproc_per_node 8 -m dit_core.cli.sample --ckpt DiT-XL-2-256x256.pt --official --npz fid50k.npz
    dit-sample --ckpt runs/digits --num-samples 10000 --labels balanced --npz digits10k.npz

``--ckpt`` takes a dit_core run folder or checkpoint, an official ``.pt``, or a diffusers DiTPipeline folder.
The labels are ``--classes`` x ``--per-class`` (in that order), or ``--num-samples N`` labels drawn by
``--labels uniform`` (independent uniform draws, as the official sample_ddp.py) or ``balanced`` (N/C per class,
shuffled), from ``--seed``. Unset sampling options come from the checkpoint's run (digits: ddim, 50 steps,
cfg 2; the guidance chosen for the run's folder when it has a ``guidance.json``, which ``--choose-guidance``
writes; an explicit ``--cfg-scale`` still wins), or for an official checkpoint from the official sample.py (ddpm, 250 steps, cfg 4, guidance on 3
channels, the mse VAE). ``--official`` is the official FID evaluation (sample_ddp.py): 250 DDPM steps, cfg 1.5,
guidance on the first 3 latent channels, the ema VAE, uniform labels, fp32 with TF32, 50,000 samples; each
setting can still be overridden.

``--npz`` streams the images to disk in shards (``<npz stem>.shards/``) and assembles the ``.npz`` at the end:
memory does not grow with N, a rerun of the same command resumes where a killed run stopped (the result is
bit-identical to an uninterrupted run), and a rerun with other settings is refused. Under ``torchrun`` every
process samples its own shards and process 0 assembles. Prints the images/s of the sampling (loading excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

OFFICIAL = dict(sampler="ddpm", steps=250, cfg_scale=1.5, guidance_channels=3, vae="ema", labels="uniform",
                precision="fp32", num_samples=50_000)


def build_parser() -> argparse.ArgumentParser:
    from dit_core.diffusion import SAMPLERS

    p = argparse.ArgumentParser(prog="dit-sample", description=__doc__.splitlines()[0].strip("`: "),
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--ckpt", required=True, help="run folder, checkpoint (.pt/.safetensors) or diffusers folder")
    p.add_argument("--classes", default=None, help="classes to sample, e.g. '0-9,12' (default: up to the first 10; "
                   "with --num-samples: all)")
    p.add_argument("--per-class", type=int, default=None, help="samples per class (default 4)")
    p.add_argument("--num-samples", type=int, default=None, help="N samples with --labels labels (FID: 50000)")
    p.add_argument("--labels", default=None, choices=["uniform", "balanced"],
                   help="labels of --num-samples: uniform draws (default, as sample_ddp.py) or balanced counts")
    p.add_argument("--official", action="store_true",
                   help="the official FID settings: ddpm 250 steps, cfg 1.5 on 3 channels, ema VAE, uniform labels, "
                   "fp32 + TF32, 50000 samples with --npz")
    p.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (1: none)")
    p.add_argument("--guidance-interval", default=None, metavar="LO,HI",
                   help="guide only where the path's time t (0: image, 1: noise) is in [LO, HI] (default: the run's "
                        "chosen guidance, else everywhere; 0,1: everywhere)")
    p.add_argument("--choose-guidance", action="store_true",
                   help="a run folder: choose its guidance for its folder first (dit_core.eval.guidance: a few scales "
                        "scored by a judge fitted on the folder), record it in <run>/guidance.json and sample with it")
    p.add_argument("--guidance-channels", type=int, default=None,
                   help="guide only the first K noise channels (3: the official sampler; default: all)")
    p.add_argument("--sampler", default=None, choices=list(SAMPLERS),
                   help="ddpm, ddim or dpm-solver++; a flow model: euler (= ddim), heun or euler-maruyama")
    p.add_argument("--steps", type=int, default=None,
                   help="sampling steps (ddpm 250; else " + ", ".join(f"{k} {v[1]}" for k, v in SAMPLERS.items() if v[1])
                        + ")")
    p.add_argument("--eta", type=float, default=0.0, help="DDIM noise (0: deterministic)")
    p.add_argument("--seed", type=int, default=0, help="sample i uses seed + i, whatever the batch size")
    p.add_argument("--vae", default=None, help="VAE id or folder for latent models (default: the checkpoint's)")
    p.add_argument("--batch-size", type=int, default=None, help="images per forward pass (default 64 on CPU, 128 on GPU)")
    p.add_argument("--decode-batch-size", type=int, default=None, help="images per VAE decode (default: batch size)")
    p.add_argument("--precision", default=None, choices=["auto", "fp32", "bf16", "fp16"],
                   help="autocast of the transformer (default auto: bf16 on bf16 GPUs and AMX CPUs; --official: fp32)")
    p.add_argument("--device", default="auto", help="cuda, cpu, cuda:1, mps or auto")
    p.add_argument("--grid", default=None, help="write a labelled PNG grid here (with --npz: of the first 100)")
    p.add_argument("--npz", default=None, help="stream arr_0 (uint8 NxHxWxC) and labels here, resumably")
    p.add_argument("--shard-size", type=int, default=None, help="images per shard of --npz (default: the batch size)")
    p.add_argument("--keep-shards", action="store_true", help="keep the shards after assembling the .npz")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def _fail(message: str, code: int = 2) -> int:
    print(f"dit-sample: {message}", file=sys.stderr)
    return code


def _check_arguments(args) -> str | None:
    if not (args.grid or args.npz):
        return "nothing to write; pass --grid out.png and/or --npz out.npz"
    if args.per_class is not None and args.per_class < 1:
        return "--per-class must be at least 1"
    if args.num_samples is not None and args.num_samples < 1:
        return "--num-samples must be at least 1"
    if args.num_samples is not None and args.per_class is not None:
        return "--num-samples and --per-class are two ways to choose the labels: pass one of them"
    if args.labels and args.num_samples is None and not args.official:
        return "--labels chooses the labels of --num-samples N; pass --num-samples too"
    if args.shard_size is not None and args.shard_size < 1:
        return "--shard-size must be at least 1"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and args.choose_guidance:
        return "--choose-guidance runs in one process; choose first (dit-sample --ckpt RUN --choose-guidance ...), then torchrun"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not args.npz:
        return "under torchrun the processes share the work of an --npz; pass --npz (a grid needs one process)"
    return None


def _settings(args, info, model) -> dict:
    """The sampling settings, from the flags, --official, and what the checkpoint says; with a note on where
    they come from when that is not obvious (an official checkpoint, a model without null class)."""
    from dit_core.diffusion import SAMPLERS
    from dit_core.sample import has_null_class

    base = dict(info)
    notes = []
    if args.official:
        if model.in_channels != 4 or info.get("space") != "latent":
            raise ValueError("--official reproduces the official evaluation of latent DiTs (guidance on 3 of the 4 "
                             f"latent channels, the SD VAE); this is a {info.get('space')} model with "
                             f"{model.in_channels} channel(s): choose --sampler, --steps and --cfg-scale instead")
        base.update({k: v for k, v in OFFICIAL.items() if k not in ("labels", "num_samples", "precision")})
        source = "--official (the official sample_ddp.py's FID settings)"
    elif info.get("kind") == "official":
        source = ("the official sample.py's settings, as this is an official checkpoint; add --official for the FID "
                  "settings of sample_ddp.py (cfg 1.5, ema VAE, uniform labels, fp32 + TF32)")
    else:
        source = None
    s = {}
    s["sampler"] = args.sampler or base.get("sampler") or "ddpm"
    s["steps"] = args.steps or (base.get("steps") if s["sampler"] == base.get("sampler") else None) or \
        (SAMPLERS[s["sampler"]][1] or 250)  # ddpm: the paper's 250
    s["cfg_scale"] = args.cfg_scale if args.cfg_scale is not None else (base.get("cfg_scale") or 4.0)
    # an explicit --cfg-scale is constant guidance unless an interval is given with it; else the run's choice
    s["guidance_interval"] = (_interval(args.guidance_interval) if args.guidance_interval is not None else
                              None if args.cfg_scale is not None else base.get("guidance_interval"))
    s["guidance_channels"] = args.guidance_channels if args.guidance_channels is not None else \
        base.get("guidance_channels")
    s["vae"] = (args.vae or base.get("vae")) if info.get("space") == "latent" else None
    s["precision"] = args.precision or ("fp32" if args.official else "auto")
    if not model.num_classes:
        s["cfg_scale"] = 1.0
    elif s["cfg_scale"] != 1.0 and not has_null_class(model):
        if args.cfg_scale is not None:  # asked for explicitly: the clear error of generate()
            from dit_core.sample import check_guidance

            check_guidance(model, s["cfg_scale"])
        notes.append(f"this model was trained with class_dropout_prob 0 (no null class): sampling without guidance "
                     f"(cfg 1, not the run's {s['cfg_scale']})")
        s["cfg_scale"] = 1.0
    s["source"] = source
    return s, notes


def _interval(text: str):
    """``"LO,HI"`` -> ``(lo, hi)``; ``"0,1"`` (everywhere) -> None."""
    from dit_core.sample import check_interval

    try:
        lo, hi = check_interval(text.replace(" ", "").split(","))
    except ValueError as err:
        raise ValueError(f"--guidance-interval: {err}") from None
    return None if (lo, hi) == (0.0, 1.0) else (lo, hi)


def _settings_note(args, s: dict, how: dict, amp: str, device) -> str:
    """One line: the settings in use and where they come from (printed for an official checkpoint or mode)."""
    changed = [k for k in ("sampler", "steps", "cfg_scale", "guidance_channels", "vae", "labels",
                           "precision") if getattr(args, k, None) is not None]
    labels = (f"{how['num_samples']} {how['labels']} labels" if how["labels"] != "classes" else
              f"{how['per_class']} per class")
    tf32 = " + TF32" if args.official and device.type == "cuda" else ""
    return (f"settings: {s['sampler']}, {s['steps']} steps, cfg {s['cfg_scale']}, guidance on "
            f"{s['guidance_channels'] or 'all'} channels, VAE {s['vae']}, {labels}, {amp}{tf32}: {s['source']}"
            + (f"; overridden: {', '.join('--' + k.replace('_', '-') for k in changed)}" if changed else ""))


def _labels(args, model, info):
    """``(labels, how)``: the label of every sample, and how they were chosen (for the manifest)."""
    from dit_core.sample import parse_classes
    from dit_core.sample.shards import make_labels

    num_classes = model.num_classes
    classes = parse_classes(args.classes, num_classes or 1) if args.classes is not None else None
    num_samples = args.num_samples
    if num_samples is None and args.official and args.npz and args.classes is None and args.per_class is None:
        num_samples = OFFICIAL["num_samples"]
    if num_samples is not None:
        mode = args.labels or "uniform"
        labels = make_labels(num_samples, num_classes, mode, args.seed, classes)
        return labels, dict(labels=mode, classes=classes, per_class=None, num_samples=num_samples)
    if classes is None:
        classes = list(range(min(10, num_classes))) if num_classes else [0]
    per_class = args.per_class or 4
    labels = [c for c in classes for _ in range(per_class)]
    return labels, dict(labels="classes", classes=classes, per_class=per_class, num_samples=len(labels))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    problem = _check_arguments(args)
    if problem:
        return _fail(problem)
    from dit_core.runtime import resolve_precision, set_tf32, set_threads
    from dit_core.sample import load_model
    from dit_core.sample.shards import SampleRunError

    set_threads()
    world_size, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    try:
        device = _start_processes(args.device, world_size)
        if args.choose_guidance and rank == 0:
            from dit_core.eval.guidance import choose_guidance

            choose_guidance(args.ckpt, device=device, progress=not args.no_progress)
        model, info = load_model(args.ckpt, device=device)
        settings, notes = _settings(args, info, model)
        amp = resolve_precision(settings["precision"], device)
        labels, how = _labels(args, model, info)
    except (FileNotFoundError, ValueError) as err:
        return _fail(str(err))
    if args.official and device.type == "cuda":
        set_tf32(True)  # sample_ddp.py: "By default, use TF32 matmuls"
    if settings["source"]:
        notes.insert(0, _settings_note(args, settings, how, amp, device))
    if rank == 0:
        for note in notes:
            print(f"dit-sample: {note}", file=sys.stderr)
    try:
        vae, vae_precision = _decoder(info, settings, args.official, device)
    except ValueError as err:
        return _fail(str(err))
    batch_size = args.batch_size or (128 if device.type == "cuda" else 64)
    options = dict(cfg_scale=settings["cfg_scale"], sampler=settings["sampler"],
                   steps=settings["steps"], guidance_channels=settings["guidance_channels"],
                   guidance_interval=settings["guidance_interval"], eta=args.eta, amp=amp,
                   device=device, batch_size=batch_size, vae=vae, decode_batch_size=args.decode_batch_size)
    summary = dict(ckpt=str(args.ckpt), kind=info.get("kind"), official=bool(args.official), images=len(labels),
                   **how, sampler=settings["sampler"], steps=settings["steps"], cfg_scale=settings["cfg_scale"],
                   guidance_interval=list(settings["guidance_interval"]) if settings["guidance_interval"] else None,
                   guidance_channels=settings["guidance_channels"], eta=args.eta, seed=args.seed, precision=amp,
                   vae=settings["vae"], device=str(device), batch_size=batch_size)
    if how["labels"] != "classes" or len(labels) > 64:
        summary["classes"] = None if how["classes"] is None else f"{len(how['classes'])} classes"
    try:
        if args.npz:
            images, seconds, sampled = _sample_npz(args, model, info, labels, how, options, summary, vae_precision,
                                                   rank, world_size)
        else:
            images, seconds, sampled = _sample_grid(args, model, info, labels, options)
    except SampleRunError as err:
        return _fail(str(err), 1)
    except ValueError as err:
        return _fail(str(err))
    finally:
        _end_processes(world_size)
    if rank == 0:
        _report(args, summary, images, labels, info, how, seconds, sampled)
    return 0


def _start_processes(device: str, world_size: int):
    """The device of this process; under torchrun (``world_size`` > 1) the process group joined."""
    import torch

    from dit_core.runtime import resolve_device

    device = resolve_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    if world_size > 1:
        import torch.distributed as dist

        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device


def _end_processes(world_size: int) -> None:
    if world_size > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _decoder(info: dict, settings: dict, official: bool, device):
    """``(vae, its precision)`` for a latent model (``(None, None)`` in pixel space): the decoder in the VAE's
    precision, fp16 on a GPU, fp32 elsewhere and in the official mode."""
    if info.get("space") != "latent":
        return None, None
    from dit_core.runtime import DTYPES, resolve_precision
    from dit_core.vae import VAENotFoundError, load_vae

    vae_precision = "fp32" if official else resolve_precision("auto", device, "vae")
    try:
        return load_vae(settings["vae"], device=device, dtype=DTYPES[vae_precision]), vae_precision
    except (VAENotFoundError, OSError, ValueError) as err:
        raise ValueError(f"this is a latent model and its VAE cannot be loaded: {err}") from None


def _sample_grid(args, model, info: dict, labels: list, options: dict):
    """``(images, seconds, count)``: every sample in memory, timed (loading excluded)."""
    import time

    import torch

    from dit_core.diffusion import process_of
    from dit_core.sample import generate

    # DiT's diffusion, or the linear interpolant of a flow model (sampled with euler, heun or euler-maruyama)
    diffusion = process_of(info, model.learn_sigma)
    start = time.perf_counter()
    images = generate(model, diffusion, labels, seed=args.seed, progress=not args.no_progress, **options)
    if options["device"].type == "cuda":
        torch.cuda.synchronize()
    return images, time.perf_counter() - start, len(labels)


def _sample_npz(args, model, info: dict, labels: list, how: dict, options: dict, summary: dict, vae_precision,
                rank: int, world_size: int):
    """``(the first 100 images for a grid or None, seconds, count sampled now)``: the samples streamed into
    ``--npz`` in shards, resumably, shared among the processes; ``summary`` gets what the run did."""
    import numpy as np
    import torch

    from dit_core.diffusion import process_of
    from dit_core.sample import generate, to_uint8
    from dit_core.sample.shards import fingerprint, sample_to_npz

    diffusion = process_of(info, model.learn_sigma)
    device = options["device"]

    def sample_fn(batch_labels, first_seed, tick):
        images = generate(model, diffusion, [int(c) for c in batch_labels], seed=first_seed, progress=False,
                          callback=lambda i: tick(len(i["x"]) / i["num_steps"]), **options)
        return to_uint8(images)

    run_settings = dict(
        {k: v for k, v in summary.items() if k not in ("ckpt", "images", "kind", "classes", "official")},
        ckpt=str(info.get("path", args.ckpt)), ckpt_fingerprint=fingerprint(info.get("path", args.ckpt)),
        classes=how["classes"], vae_precision=vae_precision,
        tf32=bool(torch.backends.cuda.matmul.allow_tf32) if device.type == "cuda" else None,
        noise_schedule=info.get("noise_schedule", "linear"), diffusion_steps=info.get("diffusion_steps", 1000),
    )
    barrier = None
    if world_size > 1:
        import torch.distributed as dist

        barrier = dist.barrier
    result = sample_to_npz(args.npz, sample_fn, run_settings, np.asarray(labels, np.int64),
                           shard_size=args.shard_size or options["batch_size"], rank=rank, world_size=world_size,
                           barrier=barrier, progress=not args.no_progress, keep_shards=args.keep_shards)
    summary.update(npz=result["npz"], images_sampled=result["sampled"], images_resumed=result["resumed"],
                   processes=world_size)
    if result.get("already_complete"):
        summary["note"] = "already complete with these settings: nothing sampled"
    images = None
    if args.grid and rank == 0:
        from dit_core.eval.samples import iter_images

        head = next(iter_images(args.npz, chunk=100))
        images = torch.from_numpy(head.copy()).permute(0, 3, 1, 2).float() / 127.5 - 1
    return images, result["seconds"], result["sampled"]


def _report(args, summary: dict, images, labels: list, info: dict, how: dict, seconds: float, sampled: int) -> None:
    """Write the grid, then print the summary (JSON with ``--json``) with the images/s of the sampling."""
    summary.update(seconds=round(seconds, 3),
                   images_per_second=round(sampled / seconds, 3) if seconds > 0 and sampled else None)
    if args.grid and images is not None:
        from dit_core.sample import save_grid

        names = info.get("label_names")
        shown = [names[c] if names and c < len(names) else str(c) for c in (int(c) for c in labels[: len(images)])]
        nrow = how["per_class"] if how["per_class"] and len(how["classes"]) > 1 else None
        save_grid(images, args.grid, nrow=nrow, labels=shown)
        summary["grid"] = args.grid
    if images is not None:
        summary["shape"] = list(images.shape[1:])
    elif summary.get("npz"):
        from dit_core.eval.samples import npz_image_shape

        summary["shape"] = list(npz_image_shape(summary["npz"])[1:])  # H, W, C as stored
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not sampled and summary.get("npz"):
        print(f"{summary['npz']}: all {len(labels)} images were sampled before with these settings; nothing to do")
    else:
        what = f"{sampled} images" + (f" (+{summary['images_resumed']} from before)"
                                      if summary.get("images_resumed") else "")
        interval = summary.get("guidance_interval")
        cfg = f"cfg {summary['cfg_scale']}" + (f" for t in [{interval[0]:g}, {interval[1]:g}]" if interval else "")
        print(f"{what} ({summary['sampler']}, {summary['steps']} steps, {cfg}, "
              f"{summary['precision']}, {summary['device']}) in {seconds:.2f} s: {summary['images_per_second']} "
              "images/s" + "".join(f"; {k} -> {summary[k]}" for k in ("grid", "npz") if k in summary))
        if "note" in summary:
            print(f"note: {summary['note']}")


if __name__ == "__main__":
    sys.exit(main())
