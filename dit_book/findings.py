"""The paper's findings in miniature: its block-design ablation and its scaling study, rerun on the digits.

Two studies, each a grid of *variants* trained by the real trainer (:func:`dit_core.train.train`) on the `digits`
profile, three seeds each, the EMA model scored every ``eval_every`` steps with the digits' judge
(:func:`dit_core.eval.classwise.sample_and_score`): class accuracy, and the Fréchet distance in the judge's
feature space ("FD": the FID recipe with a network fitted to real digits instead of Inception). Samples are drawn
**without guidance** (``cfg_scale`` 1), as the paper's ablations and scaling figures are.

* ``blocks`` (the paper's Fig. 5): the four block designs of ``DiT(block=...)`` (adaLN-Zero, adaLN,
  cross-attention, in-context) at the digits profile's size and budget.
* ``scaling`` (the paper's Figs. 2, 6 and 8): three model sizes (:data:`SIZES`, depth and width grown together as
  S/B/L do in the paper) by three patch sizes (4, 2, 1: 4, 16 and 64 tokens of an 8x8 digit), adaLN-Zero.
  Quality is read against the model's forward multiply-adds per image (the paper's "Gflops") and against the
  training compute, ``3 x Gflops x batch x steps`` (the paper's estimate: a backward pass costs two forwards).

A run's record (``record.json`` in its folder) is written atomically when it is complete; a killed run resumes
from its last checkpoint, and scored checkpoints are kept in ``evals.json``. Each run also records its process
CPU time (training and scoring), the figure the study's budget is kept in.

``python -m dit_book.findings`` runs the grids (``--estimate`` projects their CPU time first); chapter 7c
(``book/07c_paper_findings.ipynb``) reads the records, ``benchmarks/results/paper-findings.md`` says what they show.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

from dit_core.atomic import atomic_write_text
from dit_core.models import BLOCKS

from .convergence import prepare_data, score_checkpoints, study_config, training_seconds

#: The block designs, in the order of the paper's Fig. 5 legend.
DESIGNS = ("in-context", "cross-attention", "adaln", "adaln-zero")

#: Model sizes of the scaling grid: depth and width grow together, as the paper's S, B and L do (its Table 1; S to
#: B is 4x the multiply-adds per token, B to L 3.5x; here 3.4x and 2.4x). L is the digits profile's own size.
SIZES = {
    "S": dict(depth=2, hidden_size=64, num_heads=2),
    "B": dict(depth=3, hidden_size=96, num_heads=3),
    "L": dict(depth=4, hidden_size=128, num_heads=4),
}
#: Patch sizes of the scaling grid: 4, 16 and 64 tokens of an 8x8 digit (the paper: 8, 4, 2 on 32x32 latents).
PATCHES = (4, 2, 1)

#: The two studies' settings: the `digits` profile's recipe (its batch of 64, learning rate and schedule), trained
#: for ``max_steps`` (the schedule decays over them), scored every ``eval_every`` steps with ``per_class``
#: unguided samples a class and ``eval_steps`` DDIM steps.
STUDIES = {
    "blocks": dict(profile="digits", max_steps=800, eval_every=100, per_class=20, eval_steps=25, cfg_scale=1.0),
    "scaling": dict(profile="digits", max_steps=600, eval_every=100, per_class=20, eval_steps=25, cfg_scale=1.0),
}
SEEDS = (0, 1, 2)


def variants(study: str) -> dict[str, dict]:
    """The study's variants: name -> training-config overrides."""
    if study == "blocks":
        return {design: {"block": design} for design in DESIGNS}
    if study == "scaling":
        return {f"{size}/{patch}": dict(SIZES[size], patch_size=patch, block="adaln-zero")
                for size in SIZES for patch in PATCHES}
    raise ValueError(f"unknown study {study!r}; choose one of {', '.join(STUDIES)}")


def model_cost(overrides: dict, profile: str = "digits") -> dict:
    """Parameters and forward multiply-adds per image (the paper's "Gflops", in G) of a variant's model, counted on
    the meta device with the model the trainer builds for the digits (1 channel, 8x8, 10 classes)."""
    import torch

    from dit_core.measure.flops import count_params, forward_macs
    from dit_core.models import DiT
    from dit_core.train import make_config
    from dit_core.train.loop import dit_arguments

    cfg = make_config(profile, {k: v for k, v in overrides.items() if k != "data_path"})
    with torch.device("meta"):
        model = DiT(**dit_arguments(cfg, (cfg.channels, cfg.image_size, cfg.image_size), 10), block=cfg.block)
    return {"params": count_params(model), "gflops": forward_macs(model) / 1e9,
            "tokens": model.x_embedder.num_patches + model.extra_tokens}


# ----------------------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------------------


def run_one(study: str, variant: str, seed: int, work: str | os.PathLike, *, max_steps: int | None = None,
            eval_every: int | None = None, per_class: int | None = None, eval_steps: int | None = None,
            overrides: dict | None = None, keep_checkpoints: bool = False, progress: bool = False,
            quiet: bool = False) -> dict:
    """Train ``variant`` of ``study`` with ``seed`` in ``work/<study>/<variant>/seed<seed>``, score its EMA model
    every ``eval_every`` steps without guidance, and return the run's record (also written to ``record.json``).

    ``overrides``: further config keys (e.g. a smaller model for a smoke run); ``quiet``: the trainer's lines go to
    ``train.log`` in the run's folder instead of the screen. Resumes a killed run.
    """
    import contextlib

    import torch

    from dit_core.train import train

    spec = STUDIES[study]
    settings = {**variants(study)[variant], **(overrides or {})}
    work = Path(work)
    out = work / study / variant.replace("/", "-") / f"seed{seed}"
    if (out / "record.json").is_file():
        return json.loads((out / "record.json").read_text())
    max_steps = int(max_steps or spec["max_steps"])
    eval_every = int(eval_every or spec["eval_every"])
    per_class, eval_steps = int(per_class or spec["per_class"]), int(eval_steps or spec["eval_steps"])
    data_path = settings.pop("data_path", None) or prepare_data("digits", work)
    cfg = study_config(spec["profile"], settings, data_path=data_path, out=out, seed=seed, max_steps=max_steps,
                       eval_every=eval_every, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    with open(out / "train.log", "a") if quiet else contextlib.nullcontext() as log, \
            contextlib.redirect_stdout(log) if quiet else contextlib.nullcontext():
        summary = train(cfg)
    train_cpu = time.process_time() - cpu0
    if summary.get("interrupted"):
        raise KeyboardInterrupt(f"{out}: training interrupted ({summary['interrupted']}) at step "
                                f"{summary.get('steps')}; run the study again to resume this run")
    seconds = training_seconds(out / "metrics.jsonl")

    evals, judge = score_checkpoints(out, cfg, "digits", per_class=per_class, eval_steps=eval_steps,
                                     cfg_scale=spec["cfg_scale"], seconds=seconds,
                                     keep_checkpoints=keep_checkpoints)
    cost = model_cost({**settings, "data_path": data_path}, spec["profile"])
    record = {
        "study": study, "variant": variant, "seed": seed, "settings": settings, "max_steps": max_steps,
        "batch_size": cfg.batch_size, "eval_every": eval_every, "per_class": per_class, "eval_steps": eval_steps,
        "cfg_scale": spec["cfg_scale"], "sampler": "ddim", "classifier_val_accuracy": float(judge.val_accuracy),
        **cost, "evals": evals, "train_seconds": max(seconds.values()) if seconds else None,
        "cpu_seconds_this_call": time.process_time() - cpu0, "train_cpu_seconds_this_call": train_cpu,
        "wall_seconds_this_call": time.perf_counter() - t0,
        "threads": torch.get_num_threads(), "final_loss": summary.get("final_loss"),
    }
    atomic_write_text(out / "record.json", json.dumps(record, indent=1) + "\n")
    if not keep_checkpoints:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return record


# ----------------------------------------------------------------------------------------------------------
# Reading the records
# ----------------------------------------------------------------------------------------------------------


def _spread(values: list[float]) -> dict:
    values = sorted(v for v in values if v is not None and math.isfinite(v))
    if not values:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "seeds": 0}
    return {"median": statistics.median(values), "min": values[0], "max": values[-1], "seeds": len(values)}


def by_variant(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["variant"], []).append(r)
    return out


def curve(runs: list[dict], key: str) -> list[dict]:
    """Median [min, max] over seeds of ``key`` at every scored step of ``runs``."""
    steps = sorted({e["step"] for r in runs for e in r["evals"]})
    return [{"step": s, **_spread([next((e[key] for e in r["evals"] if e["step"] == s), None) for r in runs])}
            for s in steps]


def summarize(records: list[dict]) -> list[dict]:
    """One row per variant: its cost (parameters, Gflops, tokens, training compute at the last step) and, as
    median [min, max] over seeds, its class accuracy and FD at every scored step and at the end."""
    rows = []
    for variant, runs in by_variant(records).items():
        r0 = runs[0]
        acc, fd = curve(runs, "class_accuracy"), curve(runs, "frechet_distance")
        last = max(r["max_steps"] for r in runs)
        rows.append({
            "variant": variant, "seeds": len(runs), "params": r0["params"], "gflops": r0["gflops"],
            "tokens": r0["tokens"], "settings": r0["settings"], "max_steps": last, "batch_size": r0["batch_size"],
            "train_gflop": training_compute(r0["gflops"], r0["batch_size"], last),
            "accuracy": acc, "fd": fd, "final_accuracy": acc[-1] if acc else _spread([]),
            "final_fd": fd[-1] if fd else _spread([]),
            "seconds_per_step": _median_or_none([r["train_seconds"] / r["max_steps"] for r in runs
                                                 if r.get("train_seconds")]),
            "real_floor": statistics.median(e["real_floor"] for r in runs for e in r["evals"]) if r0["evals"] else None,
        })
    order = list(DESIGNS) + [f"{s}/{p}" for s in SIZES for p in PATCHES]
    rows.sort(key=lambda r: order.index(r["variant"]) if r["variant"] in order else len(order))
    return rows


def _median_or_none(values: list[float]):
    return statistics.median(values) if values else None


def training_compute(gflops: float, batch_size: int, steps: int) -> float:
    """The paper's training compute in Gflops: ``Gflops x batch x steps x 3`` (a backward pass is counted as two
    forward passes), multiply-adds as the paper counts them."""
    return 3.0 * gflops * batch_size * steps


def _cell(s: dict, fmt: str = "{:.2f}", pct: bool = False) -> str:
    if not s["seeds"]:
        return "-"
    f = (lambda v: f"{100 * v:.1f} %") if pct else (lambda v: fmt.format(v))
    if s["seeds"] == 1 or f(s["min"]) == f(s["max"]):
        return f(s["median"])
    return f"{f(s['median'])} [{f(s['min'])}, {f(s['max'])}]"


def format_blocks_table(rows: list[dict], steps: list[int] | None = None) -> str:
    """The block-design table: per design its Mflops (the paper's Gflops, forward multiply-adds per image, x 1000),
    parameters, and FD and class accuracy at some scored steps (default: a third, two thirds and all of the budget),
    median [min, max] over seeds."""
    if not rows:
        return "(no records)"
    all_steps = [p["step"] for p in rows[0]["fd"]]
    steps = steps or sorted({all_steps[max(0, len(all_steps) // 3 - 1)], all_steps[max(0, 2 * len(all_steps) // 3 - 1)],
                             all_steps[-1]})
    head = "| design | Mflops | params | " + " | ".join(f"FD @ {s}" for s in steps) + " | " + \
        " | ".join(f"accuracy @ {s}" for s in steps) + " |"
    lines = [head, "|" + "---|" * (3 + 2 * len(steps))]
    for r in rows:
        fd = {p["step"]: p for p in r["fd"]}
        acc = {p["step"]: p for p in r["accuracy"]}
        cells = [_cell(fd[s]) if s in fd else "-" for s in steps] + \
            [_cell(acc[s], pct=True) if s in acc else "-" for s in steps]
        lines.append(f"| {r['variant']} | {1e3 * r['gflops']:.2f} | {r['params'] / 1e6:.2f} M | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_scaling_table(rows: list[dict]) -> str:
    """The scaling table: per configuration its tokens, Mflops (the paper's Gflops x 1000), parameters, training
    compute and the final FD and class accuracy, median [min, max] over seeds."""
    if not rows:
        return "(no records)"
    lines = ["| model | tokens | Mflops | params | training compute (Gflop) | final FD | final accuracy |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['tokens']} | {1e3 * r['gflops']:.2f} | {r['params'] / 1e6:.2f} M | "
                     f"{r['train_gflop']:.3g} | {_cell(r['final_fd'])} | {_cell(r['final_accuracy'], pct=True)} |")
    return "\n".join(lines)


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson's correlation coefficient of two equally long lists."""
    n = len(xs)
    if n < 3:
        return math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def correlations(rows: list[dict], step: int | None = None) -> dict:
    """How well Gflops predict quality across the scaling grid, at ``step`` (default: the last scored step):
    Pearson's r of log10 Gflops with log10 FD and with class accuracy (the seeds' medians), and Spearman's rank
    correlation of Gflops with FD. The paper finds FID falling as Gflops rise (a negative correlation)."""
    pts = []
    for r in rows:
        fd = {p["step"]: p["median"] for p in r["fd"]}
        acc = {p["step"]: p["median"] for p in r["accuracy"]}
        s = step if step is not None else max(fd)
        if s in fd and math.isfinite(fd[s]) and fd[s] > 0:
            pts.append((r["gflops"], fd[s], acc[s]))
    if len(pts) < 3:
        return {"points": len(pts), "step": step}
    g = [math.log10(p[0]) for p in pts]
    return {"points": len(pts), "step": step if step is not None else max(p["step"] for p in rows[0]["fd"]),
            "pearson_log_gflops_log_fd": pearson(g, [math.log10(p[1]) for p in pts]),
            "pearson_log_gflops_accuracy": pearson(g, [p[2] for p in pts]),
            "spearman_gflops_fd": pearson(_ranks([p[0] for p in pts]), _ranks([p[1] for p in pts]))}


def compute_to(rows: list[dict], target: float) -> dict[str, float | None]:
    """Per configuration, the training compute (Gflop, :func:`training_compute`) at the first scored step where its
    median FD is at most ``target``; None when it never gets there (the paper's Figure 9 read at one FD)."""
    out = {}
    for r in rows:
        hit = next((p["step"] for p in r["fd"] if p["median"] <= target), None)
        out[r["variant"]] = training_compute(r["gflops"], r["batch_size"], hit) if hit is not None else None
    return out


def trade_offs(rows: list[dict], within: float = 1.6) -> list[dict]:
    """Pairs of scaling configurations whose Gflops differ by less than ``within`` x but that get them from
    another size and patch (one larger model with larger patches, one smaller with smaller patches): the paper's
    claim is that such pairs reach about the same quality. Each pair with its final FDs and accuracies."""
    pairs = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            ratio = max(a["gflops"], b["gflops"]) / min(a["gflops"], b["gflops"])
            sa, pa = a["variant"].split("/")
            sb, pb = b["variant"].split("/")
            if ratio < within and sa != sb and pa != pb:
                pairs.append({"a": a["variant"], "b": b["variant"], "gflops_ratio": ratio,
                              "fd": (a["final_fd"], b["final_fd"]),
                              "accuracy": (a["final_accuracy"], b["final_accuracy"]),
                              "overlap_fd": not separated(a["final_fd"], b["final_fd"])})
    return pairs


def ordering(rows: list[dict], key: str = "fd", step: int | None = None) -> list[str]:
    """Variants from best to worst by the seeds' median ``key`` ("fd": lower is better; "accuracy") at ``step``
    (default: the last)."""
    def value(r):
        pts = {p["step"]: p["median"] for p in r[key]}
        v = pts[step if step is not None else max(pts)]
        return v if key == "fd" else -v
    return [r["variant"] for r in sorted(rows, key=value)]


def separated(a: dict, b: dict) -> bool:
    """Whether two spreads over seeds do not overlap (``a`` entirely below or above ``b``)."""
    return a["max"] < b["min"] or b["max"] < a["min"]


def load_records(path: str | os.PathLike) -> dict:
    """A results file of :func:`main` (``runs``, ``settings``, ``environment``, ``summary``)."""
    return json.loads(Path(path).read_text())


# ----------------------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------------------


def plot_curves(records: list[dict], ax=None, x: str = "step", labels: dict | None = None):
    """FD and class accuracy against ``x`` ("step" or "compute": the training compute) per variant: the median
    over seeds, the range shaded. Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(12, 3.8))
    fig = ax[0].figure
    rows = summarize(records)
    for i, r in enumerate(rows):
        label = (labels or {}).get(r["variant"], r["variant"])
        for a, key in zip(ax, ("fd", "accuracy")):
            pts = r[key]
            xs = np.array([p["step"] for p in pts], dtype=float)
            if x == "compute":
                xs = np.array([training_compute(r["gflops"], r["batch_size"], p["step"]) for p in pts])
            a.plot(xs, [p["median"] for p in pts], color=f"C{i}", lw=1.6, label=label, marker="o", ms=3)
            if r["seeds"] > 1:
                a.fill_between(xs, [p["min"] for p in pts], [p["max"] for p in pts], color=f"C{i}", alpha=0.15)
    ax[0].set_ylabel("FD (digits judge's features)")
    ax[0].set_yscale("log")
    ax[1].set_ylabel("class accuracy")
    for a in ax:
        a.set_xlabel("training step" if x == "step" else "training compute (Gflop, 3 x Gflops x batch x steps)")
        if x == "compute":
            a.set_xscale("log")
        a.grid(alpha=0.3)
    ax[1].legend(fontsize=8, ncol=1 if len(rows) < 6 else 2)
    fig.tight_layout()
    return fig


def plot_gflops(records: list[dict], ax=None):
    """Final FD against Gflops per scaling configuration (the paper's Fig. 8): a point per configuration (median
    over seeds, the range as an error bar), coloured by size, marked by patch."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    markers = {4: "s", 2: "o", 1: "^"}
    for r in summarize(records):
        size, patch = r["variant"].split("/")
        f = r["final_fd"]
        colour = f"C{list(SIZES).index(size)}" if size in SIZES else "grey"
        ax.errorbar(r["gflops"], f["median"], yerr=[[f["median"] - f["min"]], [f["max"] - f["median"]]],
                    fmt=markers.get(int(patch), "o"), color=colour, capsize=3, label=r["variant"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("Gflops (forward multiply-adds per image, in G)")
    ax.set_ylabel("final FD")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=3)
    ax.figure.tight_layout()
    return ax.figure


# ----------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------


def environment() -> dict:
    import platform

    import torch

    from dit_core.measure.env import cpu_info

    return {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu_info(),
            "machine": platform.machine(), "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}


def write_results(path: Path, study: str, records: list[dict], settings: dict, cpu_seconds: float | None = None) -> str:
    rows = summarize(records)
    table = format_blocks_table(rows) if study == "blocks" else format_scaling_table(rows)
    data = {"study": study, "settings": settings, "environment": environment(), "runs": records, "summary": rows,
            "table": table, "cpu_seconds": sum(r.get("cpu_seconds_this_call") or 0 for r in records)}
    if study == "scaling":
        data["correlations"] = correlations(rows)
        data["trade_offs"] = trade_offs(rows)
    atomic_write_text(path, json.dumps(data, indent=1, default=str) + "\n")
    return table


def _run(job: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    return run_one(job["study"], job["variant"], job["seed"], job["work"], **job["kw"])


def run_grid(study: str, work: Path, results: Path, seeds, jobs: int = 1, kw: dict | None = None,
             only: list[str] | None = None, quick: bool = False) -> list[dict]:
    """Run every (variant, seed) of ``study``, ``jobs`` at a time (one thread each), rewriting
    ``results/paper-findings-<study>.json`` after every run."""
    kw = dict(kw or {})
    names = [v for v in variants(study) if not only or v in only]
    path = results / f"paper-findings-{study}{'-quick' if quick else ''}.json"
    settings = {"study": {**STUDIES[study], **kw}, "variants": {v: variants(study)[v] for v in names},
                "seeds": list(seeds), "quick": quick}
    job_list = [dict(study=study, variant=v, seed=s, work=str(work), kw=kw) for s in seeds for v in names]
    records: list[dict] = []

    def done(record):
        records.append(record)
        records.sort(key=lambda r: (r["variant"], r["seed"]))
        write_results(path, study, records, settings)
        last = record["evals"][-1] if record["evals"] else {}
        print(f"  {study} {record['variant']} seed {record['seed']}: FD {last.get('frechet_distance', math.nan):.2f}, "
              f"accuracy {last.get('class_accuracy', math.nan):.1%}, {record['cpu_seconds_this_call']:.0f} s CPU",
              flush=True)

    if jobs <= 1:
        for job in job_list:
            done(_run(job))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for future in as_completed([pool.submit(_run, job) for job in job_list]):
                done(future.result())
    print(f"\n{study} ({path}):\n{write_results(path, study, records, settings)}\n", flush=True)
    return records


QUICK = dict(max_steps=40, eval_every=20, per_class=4, eval_steps=8)


# ----------------------------------------------------------------------------------------------------------
# The chapter: its setup and its live run
# ----------------------------------------------------------------------------------------------------------

#: A smoke run's tiny DiT (the tests run the chapter with it).
SMOKE_MODEL = dict(depth=1, hidden_size=32, num_heads=2)


def chapter_setup(params: dict):
    """Chapter 7c's setup (as :mod:`dit_book.setup` does for the other chapters): reads its ``parameters``, writes
    back what this run uses, and returns ``track``, ``download``, ``data_dir``, ``latents_dir``, ``device``,
    ``out_dir``, ``live_overrides`` (the model settings the live runs add: a tiny DiT in a smoke run) and
    ``gpu_image_size``. A smoke run trains 10 steps of a tiny DiT; on the GPU track it makes stand-ins for the
    downloads (a made-up Imagenette archive, a tiny VAE, random Inception weights) and runs two designs and two
    models of the GPU studies at 32 px, 2 steps of a tiny DiT each, scored once."""
    from types import SimpleNamespace

    import torch

    from dit_core.runtime import set_threads

    from . import setup, track as tracks

    smoke = setup._smoke(params)
    (out_dir,) = setup._need(params, "OUT_DIR")
    overrides = {}
    if smoke:
        params.update(LIVE_STEPS=10, LIVE_EVAL_EVERY=5, LIVE_PER_CLASS=2, LIVE_EVAL_STEPS=3, LIVE_JOBS=1)
        overrides = dict(SMOKE_MODEL)
    set_threads(1)  # a model this small runs faster on one thread; the live runs take one core each
    torch.manual_seed(0)
    track, download = setup._gpu_route(params, smoke)
    data_dir, latents_dir = tracks.gpu_paths(params["DATA_DIR"], params["LATENTS_DIR"], smoke=smoke)
    if smoke:  # the GPU track at toy size: 32 px stand-ins, patches that fit 4x4 latents, two steps a run
        params.update(GPU_BLOCKS_MODEL="DiT-S/2", GPU_DESIGNS=["adaln-zero", "in-context"],
                      GPU_SCALING_MODELS=["DiT-S/4", "DiT-S/2"], GPU_STEPS=2, GPU_EVAL_EVERY=2, GPU_FID_SAMPLES=4,
                      GPU_FID_STEPS=2, GPU_BATCH=4,
                      GPU_OUT_DIR=out_dir + "/smoke_gpu_runs")
        if track == "gpu":
            stand = setup._standins(params, vae=True)
            if params["INCEPTION"] == "auto":
                params["INCEPTION"] = stand["inception"]
    device = setup._device(params.get("DEVICE", "auto"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(track=track, download=download, data_dir=data_dir, latents_dir=latents_dir, device=device,
                           out_dir=out, live_overrides=overrides, gpu_image_size=32 if smoke else 256,
                           gpu_overrides=dict(SMOKE_MODEL, num_workers=0, mixed_precision="fp32", tf32=False)
                           if smoke else {})


def run_live(designs, work, *, max_steps: int, eval_every: int, per_class: int, eval_steps: int,
             overrides: dict | None = None, jobs: int = 2, seed: int = 0) -> list[dict]:
    """The block-design study at a reduced size, as the chapter runs it: ``designs`` trained on the digits for
    ``max_steps`` each (the learning rate decays over them), scored every ``eval_every`` steps without guidance,
    ``jobs`` runs at a time on one thread each, the trainer's lines in each run's ``train.log``. Returns the records
    (a fresh measurement: ``work`` is cleared)."""
    work = Path(work)
    shutil.rmtree(work / "blocks", ignore_errors=True)
    kw = dict(max_steps=max_steps, eval_every=eval_every, per_class=per_class, eval_steps=eval_steps,
              overrides=overrides or {}, quiet=True)
    job_list = [dict(study="blocks", variant=d, seed=seed, work=str(work), kw=kw) for d in designs]
    if jobs <= 1 or len(job_list) == 1:
        return [_run(job) for job in job_list]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(jobs, len(job_list)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_run, job_list))


def main(argv=None) -> int:
    import argparse

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    repo = Path(__file__).resolve().parents[1]
    p = argparse.ArgumentParser(prog="python -m dit_book.findings", description=__doc__.splitlines()[0])
    p.add_argument("--studies", default="blocks,scaling", help="blocks, scaling (comma-separated)")
    p.add_argument("--variants", default=None, help="only these variants (e.g. adaln-zero,in-context or S/2,L/1)")
    p.add_argument("--seeds", type=int, default=len(SEEDS), help="seeds 0 .. N-1 (default 3)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, one thread each")
    p.add_argument("--work", default=str(repo / "runs" / "findings"), help="the runs' state (resumable)")
    p.add_argument("--results", default=str(repo / "benchmarks" / "results"), help="where the JSON records go")
    p.add_argument("--quick", action="store_true", help="tiny budgets, one seed: every code path in minutes")
    p.add_argument("--estimate", action="store_true", help="time a few steps of every variant and project the CPU time")
    for key in ("max_steps", "eval_every", "per_class", "eval_steps"):
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=None)
    args = p.parse_args(argv)
    studies = [s.strip() for s in args.studies.split(",") if s.strip()]
    for s in studies:
        variants(s)
    only = [v.strip() for v in args.variants.split(",")] if args.variants else None
    kw = dict(QUICK) if args.quick else {}
    kw.update({k: getattr(args, k) for k in ("max_steps", "eval_every", "per_class", "eval_steps")
               if getattr(args, k)})
    if args.estimate:
        return estimate(studies, Path(args.work), seeds=args.seeds, only=only)
    work = Path(args.work + ("-quick" if args.quick else ""))
    results = work if args.quick else Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    seeds = range(1 if args.quick else args.seeds)
    cpu0 = time.process_time()
    for study in studies:
        run_grid(study, work, results, seeds, args.jobs, kw, only, args.quick)
    print(f"CPU time of this command's own process: {time.process_time() - cpu0:.0f} s (the runs' CPU time is in "
          "each record's cpu_seconds_this_call)")
    return 0


def estimate(studies: list[str], work: Path, seeds: int = 3, only=None, steps: int = 20) -> int:
    """Time ``steps`` training steps and one small score of every variant on one thread; project each study."""
    import tempfile

    import torch

    torch.set_num_threads(1)
    total = 0.0
    for study in studies:
        spec = STUDIES[study]
        print(f"{study}: {'variant':10} {'s/step':>8} {'s/score':>8} {'run min':>8}")
        for variant in variants(study):
            if only and variant not in only:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                cpu0 = time.process_time()
                r = run_one(study, variant, 0, tmp, max_steps=steps, eval_every=steps, per_class=spec["per_class"],
                            eval_steps=spec["eval_steps"], overrides={"warmup_steps": 1})
                cpu = time.process_time() - cpu0
            per_step = r["train_cpu_seconds_this_call"] / steps  # CPU time: the machine may be shared
            per_eval = max(cpu - r["train_cpu_seconds_this_call"], 0.0)
            minutes = (spec["max_steps"] * per_step + spec["max_steps"] // spec["eval_every"] * per_eval) / 60
            total += minutes * seeds
            print(f"{study}: {variant:10} {per_step:8.3f} {per_eval:8.1f} {minutes:8.1f}", flush=True)
    print(f"projected CPU time, {seeds} seeds: {total / 60:.2f} h on one thread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
