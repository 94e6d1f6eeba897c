"""The paper's findings on the GPU track: the block designs and the scaling grid on Imagenette latents, with FID.

The same two studies as :mod:`dit_book.findings`, at a size a chapter can afford on one card: DiT-S/4 in each of
the four block designs, and DiT-S and DiT-B with patches 8 and 4 (:data:`DEFAULTS`), trained by the real trainer on
chapter 02's ``sd-vae-ft-ema`` latents of Imagenette at 256 px (the `imagenette-b2` profile's recipe: AdamW 1e-4,
bf16, EMA with warm-up; a batch of 128), one seed, scored every ``eval_every`` steps by FID: ``fid_samples``
unguided samples (DDIM, ``fid_steps`` steps, decoded by the VAE) against Inception statistics of Imagenette's
validation images (:func:`run_one`, the book's one study skeleton :func:`dit_book.study.train_and_score`). A pixel
model's digits judge has no counterpart here, so there is no class accuracy.

What it costs is **estimated** (:func:`costs`): the training images times 6 x the model's multiply-adds (the
FLOP counter's figure) at the trainer's utilisation measured on the H200 (:data:`dit_book.track.H200_RECORDS`),
scaled by the card's peak, plus sampling and the VAE decode scaled the same way. Small models rarely reach a large
model's utilisation, so for DiT-S and DiT-B the estimate leans short. The chapter runs both studies in one cell;
:func:`plan` sizes them together against one cell budget (:func:`dit_book.track.cell_budget`, a share of the
book's time limit for one cell), so that the cell fits on every card the book's routes name; a card without a known
peak is planned as the slowest card known (:func:`slowest_card`), and a plan that cannot fit says so.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

from . import study
from . import track as tracks
from .findings import DESIGNS

#: The GPU track's default sizes (the chapter's parameters override them).
DEFAULTS = dict(blocks_model="DiT-S/4", scaling_models=("DiT-S/8", "DiT-S/4", "DiT-B/8", "DiT-B/4"), steps=2000,
                batch_size=128, eval_every=1000, fid_samples=1000, fid_steps=50, image_size=256)
STUDIES = ("blocks", "scaling")
#: The profile the GPU studies train with (:func:`profile_for` picks its fp16 twin on cards without bf16).
PROFILE = "imagenette-b2"


def variants(study_name: str, blocks_model: str = DEFAULTS["blocks_model"], scaling_models=DEFAULTS["scaling_models"],
             designs=DESIGNS) -> dict[str, dict]:
    """The GPU study's variants: name -> training-config overrides (``designs``: the block designs compared)."""
    if study_name == "blocks":
        return {design: {"model": blocks_model, "block": design} for design in designs}
    if study_name == "scaling":
        return {name: {"model": name, "block": "adaln-zero"} for name in scaling_models}
    raise ValueError(f"unknown study {study_name!r}; choose blocks or scaling")


_MODEL_KEYS = ("model", "block", "depth", "hidden_size", "num_heads", "patch_size")


def model_facts(overrides: dict, image_size: int = 256, num_classes: int = 1000) -> dict:
    """Parameters, forward multiply-adds per image (``gflops``, in G) and tokens of a variant at ``image_size`` px:
    the DiT the trainer builds for latents of that size (:func:`dit_book.study.model_facts`)."""
    return dict(_facts(tuple((k, overrides[k]) for k in _MODEL_KEYS if k in overrides), image_size, num_classes))


@functools.lru_cache(maxsize=None)
def _facts(items: tuple, image_size: int, num_classes: int) -> tuple:
    from dit_core.train import make_config

    cfg = make_config(PROFILE, dict(items))
    return tuple(study.model_facts(cfg, (4, image_size // 8, image_size // 8), num_classes).items())


def gflops(overrides: dict, image_size: int = 256) -> float:
    """Forward multiply-adds per image (G) of a variant at ``image_size`` px."""
    return model_facts(overrides, image_size)["gflops"]


def costs(peak: float, study_name: str, steps: int = DEFAULTS["steps"], batch_size: int = DEFAULTS["batch_size"],
          eval_every: int = DEFAULTS["eval_every"], fid_samples: int = DEFAULTS["fid_samples"],
          fid_steps: int = DEFAULTS["fid_steps"], **variant_kwargs) -> dict:
    """ESTIMATED seconds of one study on a card of ``peak`` TFLOP/s: ``train`` (6 x Gflops per training image at the
    H200's measured trainer utilisation) and ``fid`` (unguided sampling, one pass a step, plus the VAE decode), from
    :data:`dit_book.track.H200_RECORDS` scaled by peak."""
    records = tracks.H200_RECORDS
    train = fid = 0.0
    evals = max(1, steps // eval_every)
    for overrides in variants(study_name, **variant_kwargs).values():
        g = gflops(overrides)
        train += steps * batch_size * 6 * g * 1e9 / (records["trainer_mfu"] * peak * 1e12)
        per_step = records["xl2_guided_step_s"] * g / tracks.GMACS["DiT-XL/2"] * 0.5 * tracks.H200_PEAK / peak
        fid += evals * fid_samples * (fid_steps * per_step + records["vae_decode_s"] * tracks.H200_PEAK / peak)
    return {"train": train, "fid": fid, "total": train + fid}


def slowest_card() -> tuple[str, float]:
    """The slowest card :data:`dit_book.track.GPU_PEAKS` knows: ``(its name pattern, its peak in TFLOP/s)``;
    :func:`plan` plans a card without a known peak as this one."""
    return min(tracks.GPU_PEAKS, key=lambda card: card[1])


def plan(peak: float | None, steps: int = DEFAULTS["steps"], eval_every: int = DEFAULTS["eval_every"],
         fid_samples: int = DEFAULTS["fid_samples"], budget_s: float | None = None, classes: int = 10,
         fit: bool = True, **kwargs) -> dict:
    """Both studies sized together against ONE cell budget ``budget_s`` (default :func:`dit_book.track.cell_budget`),
    as the chapter runs them in one cell, from the estimate of :func:`costs` on a card of ``peak`` TFLOP/s.

    In this order: the sizes as set, when they fit; else fewer steps, in whole evaluation intervals (at least one);
    else a smaller plan: one FID at the end, its samples cut to at most half the budget (a multiple of ``classes``)
    and the steps to the rest (a multiple of 100); when even the smallest plan (100 steps, one FID of ``classes``
    samples) is estimated past the budget, the note says so, with both in minutes. ``peak`` None (a card the table
    does not know, or no card): planned as the slowest card it knows (:func:`slowest_card`), said in the note.
    ``fit`` False: the sizes as set, with their estimate. Returns ``steps``, ``eval_every``, ``fid_samples``,
    ``seconds`` (the estimate), ``reduced``, ``fits`` (the estimate within the budget) and ``note`` (a sentence
    saying what was cut). ``kwargs``: more arguments of :func:`costs`."""
    unknown = ""
    if not peak:
        name, peak = slowest_card()
        unknown = (f"no peak known for this device, so planned as the slowest card dit_book.track.GPU_PEAKS knows "
                   f"({name}, {peak:g} TFLOP/s; a slower card takes longer): ")

    def estimate(s, e, f):
        parts = [costs(peak, name, steps=s, eval_every=e, fid_samples=f, **kwargs) for name in STUDIES]
        return {k: sum(p[k] for p in parts) for k in ("train", "fid", "total")}

    def result(s, e, f, seconds, reduced, note):
        return {"steps": s, "eval_every": e, "fid_samples": f, "seconds": seconds, "reduced": reduced,
                "fits": seconds <= budget, "note": unknown + note}

    budget = tracks.cell_budget() if budget_s is None else budget_s
    limit = f"the book stops a cell at {tracks.CELL_TIMEOUT_S / 60:.0f} min"
    full = estimate(steps, eval_every, fid_samples)
    if not fit or full["total"] <= budget:
        over = "" if full["total"] <= budget else f", past this cell's budget of {budget / 60:.0f} min ({limit})"
        return result(steps, eval_every, fid_samples, full["total"], False,
                      f"the sizes as set: about {full['total'] / 60:.0f} min (estimate){over}")
    per_step = full["train"] / steps
    per_sample = full["fid"] / (max(1, steps // eval_every) * fid_samples)  # one sample of every run, one FID
    for k in range(steps // eval_every - 1, 0, -1):
        seconds = k * eval_every * per_step + k * fid_samples * per_sample
        if seconds <= budget:
            return result(k * eval_every, eval_every, fid_samples, seconds, True,
                          f"{k * eval_every:,} steps a run instead of {steps:,}, to fit one cell of the book's time "
                          f"limit on this card: about {seconds / 60:.0f} min (estimate)")
    unit = 100 if steps >= 100 else 1
    samples = max(classes, min(fid_samples, int(budget / 2 / per_sample) // classes * classes))
    if (budget - samples * per_sample) / per_step < unit:  # no room left for training: the fewest samples
        samples = classes
    fit_steps = max(unit, int((budget - samples * per_sample) / per_step) // unit * unit)
    seconds = fit_steps * per_step + samples * per_sample
    cut = (f"{fit_steps:,} steps a run instead of {steps:,} and one FID of {samples:,} samples at the end instead of "
           f"{max(1, steps // eval_every)} of {fid_samples:,}")
    if seconds > budget:
        return result(fit_steps, fit_steps, samples, seconds, True,
                      f"even the smallest plan, {cut}, takes about {seconds / 60:.0f} min (estimate), past this "
                      f"cell's budget of {budget / 60:.0f} min ({limit}): run the studies outside the book's build, "
                      "or with fewer variants")
    return result(fit_steps, fit_steps, samples, seconds, True,
                  f"a smaller plan, to fit one cell of the book's time limit on this card: {cut}: about "
                  f"{seconds / 60:.0f} min (estimate); GPU_FIT_CELL = False runs the sizes as set (outside the "
                  "book's build, which stops a cell at its time limit)")


def format_plans(cards, **sizes) -> str:
    """What :func:`plan` makes of ``sizes`` on each of ``cards`` (names as torch reports them), as a Markdown table:
    both studies' estimate at the sizes as set, and the plan of the chapter's one cell with its estimate (a card
    without a known peak planned as :func:`slowest_card`)."""
    lines = ["| card | both studies as set (estimate) | the cell's plan | its estimate |", "|---|---|---|---|"]
    budget_kw = {k: v for k, v in sizes.items() if k in ("steps", "eval_every", "fid_samples")}
    other_kw = {k: v for k, v in sizes.items() if k not in budget_kw}
    for card in cards:
        peak = tracks.card_peak(card)
        name = card.replace("NVIDIA ", "")
        if peak is None:
            name += f" (no peak known: planned as {slowest_card()[0]})"
        full = plan(peak, **budget_kw, fit=False, **other_kw)["seconds"]
        p = plan(peak, **budget_kw, **other_kw)
        what = "as set" if not p["reduced"] else (f"{p['steps']:,} steps, FID every {p['eval_every']:,} of "
                                                  f"{p['fid_samples']:,} samples")
        if not p["fits"]:
            what += " (past the cell's budget)"
        lines.append(f"| {name} | ~{full / 60:.0f} min | {what} | ~{p['seconds'] / 60:.0f} min |")
    return "\n".join(lines)


def chapter_seconds(peak: float | None) -> float | None:
    """ESTIMATED seconds of chapter 7c's study cell on a card of ``peak`` TFLOP/s at the chapter's defaults, as
    :func:`plan` sizes it."""
    return plan(peak)["seconds"]


def reference_statistics(data_dir, image_size: int, inception, device, limit: int | None = None) -> tuple:
    """Inception statistics of Imagenette's validation images (all of the folder's images when it has no split)."""
    from dit_core.eval.fid import feature_statistics
    from dit_core.eval.inception import inception_features

    has_val = (Path(data_dir) / "val").is_dir()
    images, _ = tracks.real_images(data_dir, "val" if has_val else None, image_size, limit=limit)
    return feature_statistics(inception_features(images, inception, device=device)), len(images)


def profile_for(device) -> str:
    """The GPU studies' recipe on ``device``: `imagenette-b2`, or `imagenette-b2-fp16` on a GPU without bf16."""
    from dit_core.runtime import resolve_precision

    cuda = torch.device(device).type == "cuda"
    return PROFILE + "-fp16" if cuda and resolve_precision("auto", device) != "bf16" else PROFILE


def run_one(study_name: str, variant: str, work: str | os.PathLike, *, latents_dir, labels, vae, inception,
            ref_stats, device, seed: int = 0, steps: int = DEFAULTS["steps"], batch_size: int = DEFAULTS["batch_size"],
            eval_every: int = DEFAULTS["eval_every"], fid_samples: int = DEFAULTS["fid_samples"],
            fid_steps: int = DEFAULTS["fid_steps"], overrides: dict | None = None, profile: str | None = None,
            image_size: int = 256, progress: bool = True, **variant_kwargs) -> dict:
    """Train ``variant`` on the latents in ``latents_dir`` for ``steps`` and score its EMA model every ``eval_every``
    steps by FID (``fid_samples`` unguided samples of ``labels``, balanced, decoded by ``vae``) against
    ``ref_stats`` (:func:`dit_book.study.train_and_score`). ``profile``: the recipe (default :func:`profile_for`).
    Resumes a killed run; returns the record (also ``record.json`` in the run's folder)."""
    settings = {**variants(study_name, **variant_kwargs)[variant], **(overrides or {})}
    out = Path(work) / study_name / variant.replace("/", "-") / f"seed{seed}"
    cfg = study.study_config(profile or profile_for(device),
                             {"batch_size": batch_size, "grad_accum": 1, **settings},
                             data={"latents_path": str(latents_dir), "device": str(device)}, out=out, seed=seed,
                             max_steps=steps, eval_every=eval_every, progress=progress,
                             log_every=min(50, eval_every), num_workers=None)

    def scorer(cfg, seconds):
        from dit_core.diffusion import create_diffusion
        from dit_core.eval.fid import feature_statistics, frechet_distance
        from dit_core.eval.inception import inception_features
        from dit_core.runtime import resolve_precision

        diffusion = create_diffusion("", noise_schedule=cfg.noise_schedule, learn_sigma=cfg.learn_sigma)
        amp = resolve_precision(cfg.mixed_precision, torch.device(device))
        ids = torch.as_tensor(labels)
        fid_labels = ids.repeat(-(-fid_samples // len(ids)))[:fid_samples]

        def score(model, step):
            samples, sampling = tracks.sample_uint8(model, diffusion, fid_labels, sampler="ddim", steps=fid_steps,
                                                    cfg_scale=1.0, seed=1000, device=device, amp=amp, vae=vae,
                                                    batch_size=batch_size, progress=False)
            stats = feature_statistics(inception_features(samples, inception, device=device))
            return {"seconds": seconds.get(step), "frechet_distance": frechet_distance(*stats, *ref_stats),
                    "class_accuracy": None, "sampling_seconds": sampling}

        card = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"
        return score, {**model_facts(settings, image_size), "device": str(device), "card": card}

    return study.train_and_score(out, cfg, scorer, {
        "study": study_name, "variant": variant, "seed": seed, "settings": settings, "fid_samples": fid_samples,
        "fid_steps": fid_steps}, device=device)


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
