"""Guidance chosen for the folder, after training: a few settings sampled and judged, the best that keeps variety.

How strongly to guide (classifier-free guidance, Ho & Salimans 2022) depends on the data: on the project's own
folders the best constant scale moved the share of right samples by 10-25 points between folders
(``benchmarks/results/small-images-recipe.md``). Guiding only over part of the path, the middle and the end, and
not its noisy start, keeps more variety for the same gain (Kynkäänniemi et al. 2024, arXiv 2404.07724). Nothing of
this needs retraining: :func:`choose_guidance` samples the run's model with each of :data:`CANDIDATES` (the same
noise for each, so they differ only by the guidance), scores the samples with a judge fitted on the folder's own
files (:class:`dit_core.eval.folder.FolderJudge`, whose held-out accuracy is its ceiling), and picks by
:func:`pick`:

- **the guard.** Strong guidance collapses variety: every sample of a class drawn alike. A setting whose samples
  spread, class by class, less than :data:`MIN_SPREAD` of as much as the folder's own held-out files do (in the
  judge's feature space, :func:`spread_ratio`) is out;
- **the choice.** Of the others, the highest share of samples the judge names right; settings within
  :data:`TIE` of it count as equal, and of those the one whose samples lie closest to the folder's files as a
  whole (the Fréchet distance in the judge's features, the same number of samples for each) is taken.

The choice is written to ``<run>/guidance.json`` with every candidate's figures; ``dit-sample`` and
:func:`dit_core.sample.load_model` sample the run with it (an explicit ``--cfg-scale`` still wins). ``dit-train``
runs it at the end of a run whose config says ``guidance_search: true`` (the ``small-images`` profile), and
``dit-sample --ckpt RUN --choose-guidance`` on any run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

#: The settings tried: (scale, interval of the path's time t where it guides, None: everywhere).
CANDIDATES = ((1.5, None), (2.0, None), (3.0, None), (4.0, None), (3.0, (0.0, 0.6)), (5.0, (0.0, 0.6)))
#: Samples per class and setting.
PER_CLASS = 16
#: The guard: a setting whose samples spread less than this share of the real files' spread is out.
MIN_SPREAD = 0.75
#: Settings within this share of samples of the best count as equally accurate.
TIE = 0.02
#: The noise of the samples (the same for every setting).
SEED = 123
#: The chosen setting's samples, in the run's ``samples/`` folder.
GRID = "chosen_guidance.png"


def spread_ratio(features: np.ndarray, labels, real_features: np.ndarray, real_labels) -> float:
    """The samples' spread over the real files', averaged over the classes: per class, the root mean squared
    distance of its samples' features from their mean, over the same of its real files."""
    labels, real_labels = np.asarray(labels), np.asarray(real_labels)
    ratios = []
    for c in np.unique(labels):
        f, r = features[labels == c], real_features[real_labels == c]
        if len(f) < 2 or len(r) < 2:
            continue
        spread = lambda v: float(np.sqrt(np.square(v - v.mean(axis=0)).sum(axis=1).mean()))  # noqa: E731
        ratios.append(spread(f) / max(spread(r), 1e-9))
    return float(np.mean(ratios)) if ratios else float("nan")


def pick(rows: list[dict], min_spread: float = MIN_SPREAD, tie: float = TIE) -> dict:
    """The chosen row of ``rows`` (each with ``accuracy``, ``spread`` and ``frechet_distance``), by the rule of the
    module docstring; when every setting fails the guard, the one that spreads most."""
    allowed = [r for r in rows if r["spread"] >= min_spread]
    if not allowed:
        return max(rows, key=lambda r: r["spread"])
    best = max(r["accuracy"] for r in allowed)
    return min((r for r in allowed if r["accuracy"] >= best - tie), key=lambda r: r["frechet_distance"])


def run_folder_judge(config: dict, image_size: int, channels: int, run: Path | None = None):
    """The :class:`~dit_core.eval.folder.FolderJudge` of a run: its folder (``data_path``) prepared as the run
    prepared it (size, crop, channels, and the flips its probe chose, from ``<run>/probe.json``)."""
    from ..data.probe import PROBE_FILE, FolderProbe
    from .folder import FolderJudge

    flip, asymmetric = config.get("flip", True), []
    probe_path = Path(run) / PROBE_FILE if run is not None else None
    if probe_path is not None and probe_path.is_file():
        probe = FolderProbe.from_dict(json.loads(probe_path.read_text()))
        asymmetric = probe.asymmetric()
        if flip == "auto":
            flip = probe.flip_setting() if probe.mirror else True
    elif flip == "auto":
        flip = True
    if not config.get("data_path") or not Path(config["data_path"]).is_dir():
        raise FileNotFoundError(f"the run's folder {config.get('data_path')!r} is not here: the guidance is chosen "
                                "with a judge fitted on it")
    return FolderJudge(config["data_path"], image_size, crop=config.get("crop", "adm"),
                       mode="L" if channels == 1 else "RGB", flip=flip, asymmetric=asymmetric,
                       seed=int(config.get("seed", 0)))


def evaluate(model, process, judge, class_names, sampler: str, steps: int, candidates=CANDIDATES,
             per_class: int = PER_CLASS, seed: int = SEED, device=None, amp: str = "auto",
             progress: bool = False) -> list[dict]:
    """Each candidate's figures: ``cfg_scale``, ``interval``, ``accuracy``, ``per_class``, ``spread``
    (:func:`spread_ratio` against the judge's held-out files), ``mirrored`` (per class a mirror changes, the share
    of its samples the judge calls mirrored) and ``frechet_distance``; the samples themselves
    under ``images`` and ``labels`` (the model's)."""
    from .classwise import sample_and_score

    xv, yv = judge.real_images("val")
    real_features = judge.features(xv)
    rows = []
    for scale, interval in candidates:
        with torch.random.fork_rng(devices=[]):
            out = sample_and_score(model, process, judge, class_names=class_names, per_class=per_class,
                                   cfg_scale=scale, sampler=sampler, steps=steps, seed=seed, device=device, amp=amp,
                                   guidance_interval=interval, progress=progress)
        spread = spread_ratio(judge.features(out["images"]), out["judge_labels"].numpy(), real_features, yv.numpy())
        mirrored = judge.mirrored_rate(out["images"], out["judge_labels"]) if getattr(judge, "asymmetric", None) else {}
        rows.append({"cfg_scale": float(scale), "interval": list(interval) if interval else None,
                     "accuracy": out["class_accuracy"], "per_class": out["per_class_accuracy"], "spread": spread,
                     "mirrored": mirrored,
                     "frechet_distance": out["frechet_distance"], "images": out["images"], "labels": out["labels"]})
    return rows


def choose_guidance(run, device="cpu", judge=None, candidates=CANDIDATES, per_class: int = PER_CLASS,
                    seed: int = SEED, write: bool = True, progress: bool = False) -> dict:
    """Choose the guidance of the run in folder ``run`` (its ``checkpoints/last.pt``) for its folder and, with
    ``write``, record it in ``<run>/guidance.json`` (and the chosen setting's samples in ``samples/`` as
    :data:`GRID`). ``judge``: another judge (default: a
    :class:`~dit_core.eval.folder.FolderJudge` of the run's folder). Returns the record: ``chosen``
    (``cfg_scale``, ``interval``), ``candidates`` (every setting's figures), the judge's ``ceiling``, ``rule``,
    ``seconds``."""
    from ..atomic import atomic_write_text
    from ..diffusion import process_of
    from ..sample import load_model
    from ..sample.files import GUIDANCE_FILE, _training_config

    started = time.perf_counter()
    run = Path(run)
    ckpt = run / "checkpoints" / "last.pt"
    if not ckpt.is_file():
        raise FileNotFoundError(f"{run} is not a run folder with checkpoints/last.pt: guidance is chosen for a run")
    config = _training_config(ckpt)
    model, info = load_model(ckpt, device=device)
    if not info.get("null_class") or not model.num_classes:
        raise ValueError(f"{run}: the model has no null class (class_dropout_prob 0) or no classes: it cannot be guided")
    if judge is None:
        judge = run_folder_judge(config, model.input_size, model.in_channels, run)
    names = info.get("label_names") or [str(c) for c in range(model.num_classes)]
    rows = evaluate(model, process_of(info, model.learn_sigma), judge, names, info.get("sampler") or "euler",
                    int(info.get("steps") or 50), candidates, per_class, seed, device, progress=progress)
    chosen = pick(rows)
    if write:  # the chosen setting's samples, 8 a class: what dit-sample will draw
        from ..sample import save_grid

        keep = torch.cat([torch.nonzero(chosen["labels"] == c).flatten()[:8] for c in chosen["labels"].unique()])
        save_grid(chosen["images"][keep], run / "samples" / GRID, nrow=min(8, per_class),
                  labels=[names[int(c)] for c in chosen["labels"][keep]])
    rows = [{k: v for k, v in r.items() if k not in ("images", "labels")} for r in rows]
    record = {"chosen": {"cfg_scale": chosen["cfg_scale"], "interval": chosen["interval"]},
              "candidates": rows, "ceiling": float(judge.val_accuracy), "judge": type(judge).__name__,
              "held_out_files": int(getattr(judge, "num_val", 0)), "per_class": per_class,
              "sampler": info.get("sampler"), "steps": info.get("steps"), "step": _step(ckpt),
              "rule": f"highest accuracy among settings whose samples spread at least {MIN_SPREAD:g} of the "
                      f"held-out files' spread; within {100 * TIE:.0f} points of it, the lowest Fréchet distance",
              "seconds": round(time.perf_counter() - started, 1)}
    if write:
        atomic_write_text(run / GUIDANCE_FILE, json.dumps(record, indent=1) + "\n")
    return record


def _step(ckpt: Path) -> int | None:
    try:
        return int(torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True).get("step"))
    except Exception:  # noqa: BLE001 - the step is a note, not needed
        return None


def chosen_row(record: dict) -> dict:
    """The figures of the setting a guidance record (``guidance.json``) chose, from its ``candidates``."""
    chosen = record["chosen"]
    return next(r for r in record["candidates"]
                if (r["cfg_scale"], r["interval"]) == (chosen["cfg_scale"], chosen["interval"]))


def format_choice(record: dict) -> str:
    """A few lines: each setting's figures and the choice."""
    def name(r):
        return f"{r['cfg_scale']:g}" + (f" for t <= {r['interval'][1]:g}" if r["interval"] else "")

    chosen = chosen_row(record)
    lines = [f"guidance for this folder (judge's ceiling {100 * record['ceiling']:.1f} % on held-out files; "
             f"{record['per_class']} samples a class and setting):"]
    for r in record["candidates"]:
        mark = "  <- chosen" if r is chosen else ""
        mirrored = r.get("mirrored") or {}
        also = (", mirrored " + ", ".join(f"{c} {100 * v:.0f} %" for c, v in mirrored.items())) if mirrored else ""
        lines.append(f"  {name(r):>14}: {100 * r['accuracy']:5.1f} % right, spread {r['spread']:.2f}{also}{mark}")
    return "\n".join(lines)
