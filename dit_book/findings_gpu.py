"""The paper's findings on the GPU track: the block designs and the scaling grid on Imagenette latents, with FID.

The same two studies as :mod:`dit_book.findings`, at a size a chapter can afford on one card: DiT-S/4 in each of
the four block designs, and DiT-S and DiT-B with patches 8 and 4 (:data:`DEFAULTS`), trained by the real trainer on
chapter 02's ``sd-vae-ft-ema`` latents of Imagenette at 256 px (the `imagenette-b2` profile's recipe: AdamW 1e-4,
bf16, EMA with warm-up; a batch of 128), one seed, scored every ``eval_every`` steps by FID: ``fid_samples``
unguided samples (DDIM, ``fid_steps`` steps, decoded by the VAE) against Inception statistics of Imagenette's
validation images. A pixel model's digits judge has no counterpart here, so there is no class accuracy.

What it costs is **estimated** (:func:`costs`): the training images times 6 x the model's multiply-adds (the
FLOP counter's figure) at the trainer's utilisation measured on the H200 (:data:`dit_book.track.H200_RECORDS`),
scaled by the card's peak, plus sampling and the VAE decode scaled the same way. Small models rarely reach a large
model's utilisation, so for DiT-S and DiT-B the estimate leans short. :func:`plan_steps` shortens the runs on a
card whose estimate would take a cell past the book's time limit for one cell.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import torch

from dit_core.atomic import atomic_write_text

from . import track as tracks
from .findings import DESIGNS

#: The GPU track's default sizes (the chapter's parameters override them).
DEFAULTS = dict(blocks_model="DiT-S/4", scaling_models=("DiT-S/8", "DiT-S/4", "DiT-B/8", "DiT-B/4"), steps=2000,
                batch_size=128, eval_every=1000, fid_samples=1000, fid_steps=50, image_size=256)


def variants(study: str, blocks_model: str = DEFAULTS["blocks_model"], scaling_models=DEFAULTS["scaling_models"],
             designs=DESIGNS) -> dict[str, dict]:
    """The GPU study's variants: name -> training-config overrides (``designs``: the block designs compared)."""
    if study == "blocks":
        return {design: {"model": blocks_model, "block": design} for design in designs}
    if study == "scaling":
        return {name: {"model": name, "block": "adaln-zero"} for name in scaling_models}
    raise ValueError(f"unknown study {study!r}; choose blocks or scaling")


def model_facts(overrides: dict, image_size: int = 256, num_classes: int = 1000) -> dict:
    """Parameters, forward multiply-adds per image (``gflops``, in G) and tokens of a variant at ``image_size`` px,
    counted on the meta device."""
    keys = ("model", "block", "depth", "hidden_size", "num_heads", "patch_size")
    return dict(_facts(tuple((k, overrides[k]) for k in keys if k in overrides), image_size, num_classes))


@functools.lru_cache(maxsize=None)
def _facts(items: tuple, image_size: int, num_classes: int) -> tuple:
    from dit_core.measure.flops import count_params, forward_macs, meta_model

    kw = dict(items)
    model = meta_model(kw.pop("model"), image_size, num_classes=num_classes, **kw)
    return (("params", count_params(model)), ("gflops", forward_macs(model) / 1e9),
            ("tokens", model.x_embedder.num_patches + model.extra_tokens))


def gflops(overrides: dict, image_size: int = 256) -> float:
    """Forward multiply-adds per image (G) of a variant at ``image_size`` px."""
    return model_facts(overrides, image_size)["gflops"]


def costs(peak: float, study: str, steps: int = DEFAULTS["steps"], batch_size: int = DEFAULTS["batch_size"],
          eval_every: int = DEFAULTS["eval_every"], fid_samples: int = DEFAULTS["fid_samples"],
          fid_steps: int = DEFAULTS["fid_steps"], **variant_kwargs) -> dict:
    """ESTIMATED seconds of one study on a card of ``peak`` TFLOP/s: ``train`` (6 x Gflops per training image at the
    H200's measured trainer utilisation) and ``fid`` (unguided sampling, one pass a step, plus the VAE decode), from
    :data:`dit_book.track.H200_RECORDS` scaled by peak."""
    records = tracks.H200_RECORDS
    train = fid = 0.0
    evals = max(1, steps // eval_every)
    for overrides in variants(study, **variant_kwargs).values():
        g = gflops(overrides)
        train += steps * batch_size * 6 * g * 1e9 / (records["trainer_mfu"] * peak * 1e12)
        per_step = records["xl2_guided_step_s"] * g / tracks.GMACS["DiT-XL/2"] * 0.5 * tracks.H200_PEAK / peak
        fid += evals * fid_samples * (fid_steps * per_step + records["vae_decode_s"] * tracks.H200_PEAK / peak)
    return {"train": train, "fid": fid, "total": train + fid}


def plan_steps(peak: float | None, study: str, steps: int = DEFAULTS["steps"], budget_s: float | None = None,
               **kwargs) -> int:
    """The training steps of each run that keep the study's estimate (:func:`costs`) within ``budget_s`` (default:
    :func:`dit_book.track.cell_budget`, a share of the book's time limit for one cell): ``steps``, or fewer on a slow
    card, a multiple of ``eval_every``, at least one evaluation's worth. ``peak`` None: ``steps``."""
    if not peak:
        return steps
    budget = tracks.cell_budget() if budget_s is None else budget_s
    every = kwargs.get("eval_every", DEFAULTS["eval_every"])
    full = costs(peak, study, steps=steps, **kwargs)
    if full["total"] <= budget:
        return steps
    per_step = full["train"] / steps
    fits = (budget - full["fid"]) / per_step if per_step > 0 else steps
    return max(every, int(fits) // every * every)


def reference_statistics(data_dir, image_size: int, inception, device, limit: int | None = None) -> tuple:
    """Inception statistics of Imagenette's validation images (all of the folder's images when it has no split)."""
    from dit_core.eval.fid import feature_statistics
    from dit_core.eval.inception import inception_features

    has_val = (Path(data_dir) / "val").is_dir()
    images, _ = tracks.real_images(data_dir, "val" if has_val else None, image_size, limit=limit)
    return feature_statistics(inception_features(images, inception, device=device)), len(images)


def run_one(study: str, variant: str, work: str | os.PathLike, *, latents_dir, labels, vae, inception, ref_stats,
            device, seed: int = 0, steps: int = DEFAULTS["steps"], batch_size: int = DEFAULTS["batch_size"],
            eval_every: int = DEFAULTS["eval_every"], fid_samples: int = DEFAULTS["fid_samples"],
            fid_steps: int = DEFAULTS["fid_steps"], overrides: dict | None = None, profile: str | None = None,
            image_size: int = 256, progress: bool = True, **variant_kwargs) -> dict:
    """Train ``variant`` on the latents in ``latents_dir`` for ``steps`` and score its EMA model every ``eval_every``
    steps by FID (``fid_samples`` unguided samples of ``labels``, balanced, decoded by ``vae``) against
    ``ref_stats``. ``profile``: the recipe (default: `imagenette-b2`, or `imagenette-b2-fp16` on a GPU without
    bf16). Resumes a killed run; returns the record (also ``record.json`` in the run's folder)."""
    from dit_core.checkpoint import load_dit
    from dit_core.diffusion import create_diffusion
    from dit_core.eval.fid import feature_statistics, frechet_distance
    from dit_core.eval.inception import inception_features
    from dit_core.runtime import resolve_precision
    from dit_core.train import make_config, train

    settings = {**variants(study, **variant_kwargs)[variant], **(overrides or {})}
    if profile is None:
        cuda = torch.device(device).type == "cuda"
        profile = "imagenette-b2-fp16" if cuda and resolve_precision("auto", device) != "bf16" else "imagenette-b2"
    out = Path(work) / study / variant.replace("/", "-") / f"seed{seed}"
    if (out / "record.json").is_file():
        return json.loads((out / "record.json").read_text())
    cfg = make_config(profile, {
        "latents_path": str(latents_dir), "out": str(out), "seed": seed, "max_steps": steps, "batch_size": batch_size,
        "grad_accum": 1, "ckpt_every": eval_every, "keep_every": eval_every, "log_every": min(50, eval_every),
        "sample_every": 0, "sample_at_end": False, "tensorboard": False, "progress": progress, "resume": "auto",
        "max_minutes": 0, "device": str(device), **settings})
    t0 = time.perf_counter()
    train(cfg)
    train_seconds = time.perf_counter() - t0
    diffusion = create_diffusion("", noise_schedule=cfg.noise_schedule, learn_sigma=cfg.learn_sigma)
    amp = resolve_precision(cfg.mixed_precision, torch.device(device))
    labels = torch.as_tensor(labels)
    fid_labels = labels.repeat(-(-fid_samples // len(labels)))[:fid_samples]
    evals = []
    for path in sorted((out / "checkpoints").glob("step_*.pt")):
        model = load_dit(path, device=device)
        samples, seconds = tracks.sample_uint8(model, diffusion, fid_labels, sampler="ddim", steps=fid_steps,
                                               cfg_scale=1.0, seed=1000, device=device, amp=amp, vae=vae,
                                               batch_size=batch_size, progress=False)
        stats = feature_statistics(inception_features(samples, inception, device=device))
        evals.append({"step": int(path.stem.split("_")[1]), "frechet_distance": frechet_distance(*stats, *ref_stats),
                      "class_accuracy": None, "sampling_seconds": seconds})
        path.unlink()
    record = {"study": study, "variant": variant, "seed": seed, "settings": settings, "max_steps": steps,
              "batch_size": batch_size, "eval_every": eval_every, "fid_samples": fid_samples, "fid_steps": fid_steps,
              **model_facts(settings, image_size), "evals": evals,
              "train_wall_seconds": train_seconds, "device": str(device),
              "card": torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"}
    atomic_write_text(out / "record.json", json.dumps(record, indent=1) + "\n")
    return record


def format_table(records: list[dict]) -> str:
    """FID per variant at every scored step (one seed), with its Gflops and parameters."""
    if not records:
        return "(no records)"
    steps = sorted({e["step"] for r in records for e in r["evals"]})
    lines = ["| variant | Gflops | params | " + " | ".join(f"FID @ {s:,}" for s in steps) + " |",
             "|" + "---|" * (3 + len(steps))]
    for r in records:
        fid = {e["step"]: e["frechet_distance"] for e in r["evals"]}
        lines.append(f"| {r['variant']} | {r['gflops']:.2f} | {r['params'] / 1e6:.1f} M | "
                     + " | ".join(f"{fid[s]:.1f}" if s in fid else "-" for s in steps) + " |")
    return "\n".join(lines)
