"""How fast does each training objective converge? Runs, records, the steps-to-quality table and the curves.

One *run* trains a profile with one *method* (a set of :mod:`dit_core.train.objectives` options, or several
joined by ``+``) for a fixed budget of steps, with the trainer itself (:func:`dit_core.train.train`), keeping a
checkpoint every ``eval_every`` steps. Each kept checkpoint's EMA model is then sampled per class and scored by
the dataset's judge (:func:`dit_core.eval.classwise.sample_and_score`): class accuracy and the Fréchet distance
in the judge's feature space, against training steps and training seconds (the trainer's own step timings:
sampling, checkpoints and evaluation are not counted; fitting a pixel teacher is recorded apart as
``setup_seconds``). Every method gets the same budget, batch and learning-rate schedule: the profile's.

A run's record is written atomically when it is complete, and a run that was killed continues where it
stopped (the trainer resumes from its last checkpoint, scored checkpoints are kept in ``evals.json``).

The headline (:func:`summarize`): the number of steps (and seconds) at which a run first reaches a class
accuracy of 95 % and a Fréchet distance target, per method as the median over seeds with the range, and its
ratio to DiT's recipe (``dit``). A run that never gets there within the budget counts as "more than the
budget" and is shown as such.

``benchmarks/convergence.py`` runs the grid; chapter "Converging faster" reads the records.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from .study import judge_scorer, load_records, plot_curves as _plot_curves, study_config, train_and_score  # noqa: F401
from .study import training_seconds  # noqa: F401 (part of this module's interface)

#: Every option of dit_core.train.objectives at its value in DiT's recipe: the baseline sets them explicitly,
#: so that it stays DiT's recipe whatever a profile turns on.
OFF = dict(objective="ddpm", learn_sigma=True, sample_sampler="ddim", timestep_sampling="uniform",
           loss_weighting="none", mask_ratio=0.0, repa_weight=0.0)  # DiT's recipe, also on a profile made for flow

#: The single methods: their settings, the papers' values where they apply at this scale.
METHODS = {
    "dit": {},
    "flow": dict(objective="flow", learn_sigma=False, sample_sampler="euler"),
    "logit_normal": dict(timestep_sampling="logit_normal", logit_mean=0.0, logit_std=1.0),
    "min_snr": dict(loss_weighting="min_snr", min_snr_gamma=5.0),
    "mask": dict(mask_ratio=0.5, mask_decoder_depth=1, mae_weight=0.1, mask_finetune_fraction=0.1),
    # REPA aligns block 8 of 28 (XL) or 4 of 12 (B), about a third of the depth; 2 of 4 here. Its projector is
    # 2048 wide for a 1152-wide DiT; 256 here for a 128-wide one (2048 would cost more than the DiT itself).
    "repa": dict(repa_weight=0.5, repa_depth=2, repa_projector_dim=256),
}

#: The datasets: a profile, its data, its judge, and the evaluation settings. Scoring is not cheap: one score
#: samples ``per_class`` images per class with ``eval_steps`` guided sampler steps (two forward passes each),
#: about the compute of 50 training steps of the digits (200 images x 25 DDIM steps) and of 200 training steps of
#: the shapes (150 images of 32 px, 50 steps). The digits are scored with 25 DDIM steps, not 50: with 16 scores per
#: run, 50 steps made scoring 2/3 of a run's time (measured: 135 s of training, ~6 min of scoring on one thread),
#: and every method is scored the same way.
DATASETS = {
    "digits": dict(profile="digits", data="digits", eval_every=50, per_class=20, eval_steps=25),
    # the profile trains for a time budget; the methods are compared at equal steps (the record's 1,000)
    "shapes": dict(profile="small-images", data="shapes", eval_every=150, per_class=50, eval_steps=50,
                   max_steps=1000),
}

ACCURACY_TARGET = 0.95


def method_settings(method: str) -> dict:
    """The config overrides of ``method``: a name of :data:`METHODS` or several joined by ``+``."""
    settings = dict(OFF)
    for part in method.split("+"):
        if part not in METHODS:
            raise ValueError(f"unknown method {part!r}; choose from {', '.join(METHODS)} (join several with +)")
        settings.update(METHODS[part])
    return settings


def config_overrides(method: str, max_steps: int) -> dict:
    """:func:`method_settings` as training config keys (the fine-tuning fraction becomes steps)."""
    settings = method_settings(method)
    fraction = settings.pop("mask_finetune_fraction", None)
    if fraction is not None:
        settings["mask_finetune_steps"] = int(round(fraction * max_steps))
    return settings


# ----------------------------------------------------------------------------------------------------------
# Data and judges
# ----------------------------------------------------------------------------------------------------------


def prepare_data(dataset: str, work: Path) -> str:
    """The ``data_path`` of a dataset: "digits" (the trainer exports them), or the shapes folder, generated
    once into ``work/data/shapes`` (``python -m dit_core.data.shapes``). The shapes are turned at any angle, as
    when the committed records were measured (``dit-data shapes`` now writes upright ones by default)."""
    if DATASETS[dataset]["data"] == "digits":
        return "digits"
    from dit_core.data.shapes import generate_shapes

    return str(generate_shapes(work / "data" / "shapes", rotation="any"))


def judge_for(dataset: str, class_names, image_size: int, channels: int):
    """The dataset's judge (:mod:`dit_core.eval.classwise`)."""
    from dit_core.eval.classwise import digits_judge

    if dataset == "digits":
        return digits_judge()
    from dit_core.eval.shapes import classifier

    return classifier(class_names, image_size, "L" if channels == 1 else "RGB")


# ----------------------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------------------


def run_one(dataset: str, method: str, seed: int, work: str | os.PathLike, *, max_steps: int | None = None,
            eval_every: int | None = None, per_class: int | None = None, eval_steps: int | None = None,
            overrides: dict | None = None, keep_checkpoints: bool = False, progress: bool = False) -> dict:
    """Train ``method`` on ``dataset`` with ``seed`` for ``max_steps`` (default: the profile's) in
    ``work/<dataset>/<method>/seed<seed>``, score every ``eval_every`` steps, and return the run's record
    (:func:`dit_book.study.train_and_score`).

    Resumes a killed run. ``overrides``: further config keys (e.g. a smaller model for a smoke run). Scored
    checkpoints are deleted unless ``keep_checkpoints``; the record is also written to ``record.json``.
    """
    from dit_core.train.config import read_profile

    spec = DATASETS[dataset]
    out = Path(work) / dataset / method / f"seed{seed}"
    if (out / "record.json").is_file():
        return json.loads((out / "record.json").read_text())
    profile = read_profile(spec["profile"])
    max_steps = int(max_steps or spec.get("max_steps") or profile.get("max_steps", 1000))
    eval_every = int(eval_every or spec["eval_every"])
    per_class, eval_steps = int(per_class or spec["per_class"]), int(eval_steps or spec["eval_steps"])
    settings = {**config_overrides(method, max_steps), **(overrides or {})}
    data_path = settings.pop("data_path", None) or prepare_data(dataset, Path(work))
    cfg = study_config(spec["profile"], settings, data={"data_path": data_path}, out=out, seed=seed,
                       max_steps=max_steps, eval_every=eval_every, progress=progress)

    def scorer(cfg, seconds):
        judge, classes = judge_of_run(out, dataset)
        score = judge_scorer(cfg, judge, classes, per_class=per_class, eval_steps=eval_steps,
                             cfg_scale=cfg.sample_cfg_scale, seconds=seconds)
        return score, {"classifier_val_accuracy": float(judge.val_accuracy)}

    sampler = "ddim" if cfg.objective == "ddpm" else "euler (= ddim)"
    return train_and_score(out, cfg, scorer, {
        "dataset": dataset, "method": method, "seed": seed, "settings": settings, "per_class": per_class,
        "eval_steps": eval_steps, "cfg_scale": cfg.sample_cfg_scale, "sampler": sampler},
        keep_checkpoints=keep_checkpoints, remove=("data",))


def judge_of_run(out: Path, dataset: str):
    """``(judge, class names)`` of a run in ``out``: the dataset's judge (:func:`judge_for`) for the classes and
    sample shape its checkpoint records."""
    import torch

    config = torch.load(out / "checkpoints" / "last.pt", map_location="cpu", weights_only=True, mmap=True)["config"]
    classes = [str(c) for c in config["classes"]]
    channels, size = config["sample_shape"][0], config["sample_shape"][-1]
    return judge_for(dataset, classes, size, channels), classes


# ----------------------------------------------------------------------------------------------------------
# Reading the records: steps to a target, the table, the curves
# ----------------------------------------------------------------------------------------------------------


def first_reaching(evals: list[dict], key: str, target: float, lower_is_better: bool = False):
    """The first evaluation at which ``key`` reaches ``target`` (``>=``, or ``<=`` when lower is better), or
    None within the run."""
    for e in evals:
        value = e.get(key)
        if value is not None and (value <= target if lower_is_better else value >= target):
            return e
    return None


def _reach(values: list[float | None], budget: float | None) -> dict:
    """Median and range of per-seed values; None (never reached) counts as above the budget."""
    reached = [v for v in values if v is not None]
    ranked = sorted(v if v is not None else math.inf for v in values)
    median = statistics.median(ranked) if ranked else math.inf
    return {"median": median, "min": ranked[0] if ranked else math.inf, "max": ranked[-1] if ranked else math.inf,
            "reached": len(reached), "seeds": len(values), "budget": budget}


def fd_target_of(records: list[dict]) -> float | None:
    """The default Fréchet-distance target: the median over seeds of DiT's final distance (the quality the
    baseline reaches at the end of its budget)."""
    finals = [r["evals"][-1]["frechet_distance"] for r in records if r["method"] == "dit" and r["evals"]]
    return statistics.median(finals) if finals else None


def summarize(records: list[dict], accuracy_target: float = ACCURACY_TARGET, fd_target: float | None = None) -> list[dict]:
    """One row per method: steps and seconds to ``accuracy_target`` and to ``fd_target`` (default:
    :func:`fd_target_of`), each as median and range over seeds, the ratio of DiT's median to the method's (above
    1: faster), and the final accuracy and distance."""
    fd_target = fd_target if fd_target is not None else fd_target_of(records)
    by_method: dict[str, list[dict]] = {}
    for r in records:
        by_method.setdefault(r["method"], []).append(r)
    rows = []
    for method, runs in by_method.items():
        budget = max(r["max_steps"] for r in runs)
        row = {"method": method, "seeds": len(runs), "budget_steps": budget}
        for name, key, target, lower in (("accuracy", "class_accuracy", accuracy_target, False),
                                         ("fd", "frechet_distance", fd_target, True)):
            hits = [first_reaching(r["evals"], key, target, lower) if target is not None else None for r in runs]
            row[f"steps_to_{name}"] = _reach([h["step"] if h else None for h in hits], budget)
            row[f"seconds_to_{name}"] = _reach([h["seconds"] if h else None for h in hits], None)
        finals = sorted(r["evals"][-1]["class_accuracy"] for r in runs if r["evals"])
        row["final_accuracy"] = statistics.median(finals)
        row["final_accuracy_range"] = (finals[0], finals[-1])  # over seeds: the verdict when no run hits 95 %
        row["final_fd"] = statistics.median(r["evals"][-1]["frechet_distance"] for r in runs if r["evals"])
        row["seconds_per_step"] = statistics.median(r["train_seconds"] / r["max_steps"] for r in runs
                                                    if r.get("train_seconds"))
        rows.append(row)
    base = next((r for r in rows if r["method"] == "dit"), None)
    for row in rows:
        for name in ("accuracy", "fd"):
            for unit in ("steps", "seconds"):
                b = base[f"{unit}_to_{name}"]["median"] if base else math.inf
                m = row[f"{unit}_to_{name}"]["median"]
                row[f"{unit}_speedup_{name}"] = b / m if math.isfinite(b) and math.isfinite(m) and m > 0 else None
    order = ["dit"] + [m for m in METHODS if m != "dit"]
    rows.sort(key=lambda r: (order.index(r["method"]) if r["method"] in order else len(order), r["method"]))
    for row in rows:
        row["targets"] = {"accuracy": accuracy_target, "fd": fd_target}
    return rows


def best_combination(records: list[dict], accuracy_target: float = ACCURACY_TARGET) -> str:
    """The combination to measure: every single method whose median steps to ``accuracy_target`` beat DiT's
    (several joined by ``+``); the best single one when none or one did. Where neither reaches the target within
    the budget, the higher median final accuracy is better, then the lower final Fréchet distance."""
    rows = [r for r in summarize(records, accuracy_target) if "+" not in r["method"]]
    base = next((r for r in rows if r["method"] == "dit"), None)
    if base is None:
        raise ValueError("the combination is chosen from the single methods' records, which need DiT's ('dit')")
    key = lambda r: (r["steps_to_accuracy"]["median"], -r["final_accuracy"], r["final_fd"])  # noqa: E731
    better = [r["method"] for r in sorted(rows, key=key) if r["method"] != "dit" and key(r) < key(base)]
    if len(better) >= 2:
        return "+".join(m for m in METHODS if m in better)
    return better[0] if better else min((r for r in rows if r["method"] != "dit"), key=key)["method"]


def _reach_cell(spread: dict, unit: str = "") -> str:
    def fmt(v):
        return f">{spread['budget']}" if not math.isfinite(v) and spread.get("budget") else \
            ("never" if not math.isfinite(v) else f"{v:.0f}{unit}")

    if spread["seeds"] == 1 or spread["min"] == spread["max"]:
        return fmt(spread["median"])
    return f"{fmt(spread['median'])} [{fmt(spread['min'])}, {fmt(spread['max'])}]"


def verdict(row: dict, base: dict) -> str:
    """Did ``row``'s method beat DiT's recipe (``base``, both rows of :func:`summarize`)? "faster" or "slower"
    when the ranges over seeds of the steps to the accuracy target do not overlap; when neither method reaches the
    target within the budget (the shapes at this budget), the same test on the final accuracy ("better" or
    "worse"); otherwise "no clear difference". One seed on either side gives no verdict."""
    if min(row["seeds"], base["seeds"]) < 2:
        return "one seed: no verdict"
    m, b = row["steps_to_accuracy"], base["steps_to_accuracy"]
    if m["reached"] or b["reached"]:
        return "faster" if m["max"] < b["min"] else "slower" if m["min"] > b["max"] else "no clear difference"
    (m_lo, m_hi), (b_lo, b_hi) = row["final_accuracy_range"], base["final_accuracy_range"]
    verdict_ = "better" if m_lo > b_hi else "worse" if m_hi < b_lo else "no clear difference in"
    return f"{verdict_} final accuracy (neither reaches {row['targets']['accuracy']:.0%})"


def _final_cell(row: dict) -> str:
    lo, hi = row.get("final_accuracy_range", (row["final_accuracy"],) * 2)
    spread = f" [{lo:.0%}, {hi:.0%}]" if row["seeds"] > 1 and hi > lo else ""
    return f"{row['final_accuracy']:.1%}{spread}"


def format_table(rows: list[dict]) -> str:
    """The summary as a Markdown table: median [min, max] over seeds (">N": not reached within the budget of N
    steps), the speed-up over DiT's recipe (its median divided by the method's), and the final accuracy (median
    [min, max])."""
    if not rows:
        return "(no records)"
    t = rows[0]["targets"]
    fd = f"FD <= {t['fd']:.2f}" if t["fd"] is not None else "FD target"
    lines = [f"| method | seeds | steps to {t['accuracy']:.0%} acc. | x DiT | steps to {fd} | x DiT | "
             "s/step | final acc. | final FD |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = [f"{r[k]:.2f}" if r[k] is not None else "-" for k in ("steps_speedup_accuracy", "steps_speedup_fd")]
        lines.append(f"| {r['method']} | {r['seeds']} | {_reach_cell(r['steps_to_accuracy'])} | {speed[0]} | "
                     f"{_reach_cell(r['steps_to_fd'])} | {speed[1]} | {r['seconds_per_step']:.3f} | "
                     f"{_final_cell(r)} | {r['final_fd']:.2f} |")
    return "\n".join(lines)


def plot_curves(records: list[dict], x: str = "step", ax=None, accuracy_target: float = ACCURACY_TARGET):
    """Class accuracy and Fréchet distance against ``x`` ("step" or "seconds") per method
    (:func:`dit_book.study.plot_curves`): the median over seeds, the range shaded; DiT's recipe drawn thicker,
    combinations dashed, the accuracy target dotted. Returns the figure."""
    methods = dict.fromkeys(r["method"] for r in records)
    styles = {m: dict(lw=2.2 if m == "dit" else 1.4, ls="--" if "+" in m else "-", marker="") for m in methods}
    return _plot_curves(records, group="method", x=x, keys=("class_accuracy", "frechet_distance"), ax=ax,
                        styles=styles, hline={"class_accuracy": accuracy_target})
