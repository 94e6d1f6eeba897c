"""The book's studies, one skeleton: train a variant with the real trainer, score its checkpoints, keep a record.

Three studies use it: chapter 07b's training objectives (:mod:`dit_book.convergence`, ``benchmarks/convergence.py``),
chapter 7c's block designs and scaling grid on the digits (:mod:`dit_book.findings`) and the same on Imagenette
latents (:mod:`dit_book.findings_gpu`). What differs between them is the variant's settings and how a checkpoint is
scored (the digits' judge, or FID); the rest is here:

* :func:`study_config`: the trainer's config of one run (equal steps for every variant, a checkpoint every
  ``eval_every`` steps, resumed when its folder holds one);
* :func:`train_and_score`: one run. A finished run's ``record.json`` is read back; otherwise the trainer runs (and
  resumes a killed run), an interrupted run records nothing, each kept checkpoint's EMA model is scored oldest
  first (:func:`score_checkpoints`, written to ``evals.json`` as it goes, so a killed scoring continues), and the
  record is written atomically with the run's training seconds, CPU time and wall time;
* :func:`judge_scorer`: the score of the pixel studies (class accuracy and the Fréchet distance in the judge's
  features, :func:`dit_core.eval.classwise.sample_and_score`);
* :func:`model_facts`: the one count of a variant's parameters, forward multiply-adds (the paper's Gflops) and
  tokens, on the meta device;
* :func:`run_jobs`: several runs at a time, one thread each, stopped together by ``kill``;
* reading records: :func:`load_records` (a record's variant names read as the code names them,
  :data:`RECORD_SIZE_NAMES`), :func:`spread` and :func:`curve` (median [min, max] over seeds), :func:`plot_curves`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

from dit_core.atomic import atomic_write_text

# ----------------------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------------------


def study_config(profile: str, settings: dict, *, out, seed: int, max_steps: int, eval_every: int,
                 progress: bool = False, data: dict | None = None, log_every: int | None = None,
                 num_workers: int | None = 0):
    """The trainer's config for one run of a study: ``max_steps`` and no time budget (equal steps for every
    variant, not equal minutes), a checkpoint every ``eval_every`` steps for :func:`score_checkpoints`, a log line
    every ``log_every`` (default ``eval_every``) steps, no sample grids, resumed when its folder holds a checkpoint.
    ``data``: where the data is (``data_path``, or ``latents_path``, and e.g. the device); ``num_workers`` None
    keeps the profile's loader processes; ``settings`` last, so a variant's keys win."""
    from dit_core.train import make_config

    return make_config(profile, {
        **(data or {}), "out": str(out), "seed": seed, "max_steps": max_steps, "ckpt_every": eval_every,
        "keep_every": eval_every, "log_every": log_every or eval_every, "sample_every": 0, "sample_at_end": False,
        "tensorboard": False, "progress": progress, "resume": "auto", "max_minutes": 0,
        **({} if num_workers is None else {"num_workers": num_workers}), **settings})


def training_seconds(metrics_path: Path) -> dict[int, float]:
    """Cumulative training seconds at every logged step, from the trainer's own step rates (``steps_per_s``
    over each logging window: pauses for checkpoints and grids excluded; a resumed run's windows add up)."""
    seconds, total, previous = {}, 0.0, 0
    for line in Path(metrics_path).read_text().splitlines():
        record = json.loads(line)
        if record.get("steps_per_s"):
            total += (record["step"] - previous) / record["steps_per_s"]
            previous = record["step"]
            seconds[record["step"]] = total
    return seconds


def score_checkpoints(out: Path, score, *, keep_checkpoints: bool = False, device="cpu") -> list[dict]:
    """Score every kept checkpoint (``checkpoints/step_*.pt``) of the run in ``out``, oldest first, with
    ``score(model, step) -> dict`` (the EMA model, in eval mode). Each score is written to ``evals.json`` as it
    comes, so a killed scoring continues; a scored checkpoint is deleted unless ``keep_checkpoints``."""
    import torch

    from dit_core.checkpoint import load_dit

    evals_path = out / "evals.json"
    evals = json.loads(evals_path.read_text()) if evals_path.is_file() else []
    done = {e["step"] for e in evals}
    for path in sorted((out / "checkpoints").glob("step_*.pt")):
        step = int(path.stem.split("_")[1])
        if step not in done:
            model = load_dit(path, device=device)
            with torch.random.fork_rng(devices=[]):
                evals.append({"step": step, **score(model, step)})
            evals.sort(key=lambda e: e["step"])
            atomic_write_text(evals_path, json.dumps(evals, indent=1) + "\n")
        if not keep_checkpoints:
            path.unlink(missing_ok=True)
    return evals


def judge_scorer(cfg, judge, class_names, *, per_class: int, eval_steps: int, cfg_scale: float, seconds: dict,
                 measure=None):
    """The score of a pixel study's checkpoint: ``per_class`` samples a class (DDIM with ``eval_steps``, seed 0,
    guidance ``cfg_scale``) judged by ``judge``: class accuracy, Fréchet distance in the judge's features, the real
    floor, and the training seconds at that step; ``measure(model, process, judge) -> dict`` adds its figures."""
    from dit_core.diffusion import create_process
    from dit_core.eval.classwise import sample_and_score

    process = create_process(cfg.objective, noise_schedule=cfg.noise_schedule, learn_sigma=cfg.learn_sigma,
                             diffusion_steps=cfg.diffusion_steps)

    def score(model, step):
        result = sample_and_score(model, process, judge, class_names=class_names, per_class=per_class,
                                  cfg_scale=cfg_scale, sampler="ddim", steps=eval_steps, seed=0)
        return {"seconds": seconds.get(step), "class_accuracy": result["class_accuracy"],
                "frechet_distance": result["frechet_distance"], "real_floor": result["real_floor"],
                **(measure(model, process, judge) if measure else {})}

    return score


def train_and_score(out: str | os.PathLike, cfg, scorer, record: dict, *, quiet: bool = False,
                    keep_checkpoints: bool = False, remove: tuple[str, ...] = ("checkpoints",),
                    device="cpu") -> dict:
    """Train ``cfg`` in ``out`` (its ``out``) and score its checkpoints; return the run's record (also
    ``record.json`` in ``out``). A finished run is read back; a killed one resumes.

    ``scorer(cfg, seconds) -> (score, facts)``: ``score(model, step) -> dict`` scores one checkpoint
    (:func:`score_checkpoints`), ``facts`` joins the record (e.g. the judge's own accuracy). ``record``: what names
    the run (study, variant, seed, settings, ...), first in the record. ``quiet``: the trainer's lines go to
    ``train.log`` in ``out``. After the record is written, the folders ``remove`` are deleted unless
    ``keep_checkpoints``. A run that the trainer reports interrupted (a stop signal: it saved and returned) raises
    :class:`KeyboardInterrupt` and records nothing, so the same command started again continues it."""
    import torch

    from dit_core.train import train

    out = Path(out)
    if (out / "record.json").is_file():
        return json.loads((out / "record.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    fresh = not (out / "checkpoints" / "last.pt").exists()
    with open(out / "train.log", "a") if quiet else contextlib.nullcontext() as log, \
            contextlib.redirect_stdout(log) if quiet else contextlib.nullcontext():
        summary = train(cfg)
    train_cpu = time.process_time() - cpu0
    if summary.get("interrupted"):  # SIGTERM/SIGINT: the trainer saved and stopped; a record here would be partial
        raise KeyboardInterrupt(f"{out}: training interrupted ({summary['interrupted']}) at step "
                                f"{summary.get('steps')}; run the study again to resume this run")
    # building the model and the data (and with REPA on pixels fitting the teacher): once per run
    setup = summary["wall_seconds"] - summary["train_seconds"] if fresh else None
    seconds = training_seconds(out / "metrics.jsonl")
    score, facts = scorer(cfg, seconds)
    evals = score_checkpoints(out, score, keep_checkpoints=keep_checkpoints, device=device)
    record = {**record, "max_steps": cfg.max_steps, "batch_size": cfg.batch_size, "eval_every": cfg.ckpt_every,
              **facts, "evals": evals, "train_seconds": max(seconds.values()) if seconds else None,
              "setup_seconds": setup, "cpu_seconds_this_call": time.process_time() - cpu0,
              "train_cpu_seconds_this_call": train_cpu, "wall_seconds_this_call": time.perf_counter() - t0,
              "threads": torch.get_num_threads(), "final_loss": summary.get("final_loss")}
    atomic_write_text(out / "record.json", json.dumps(record, indent=1) + "\n")
    if not keep_checkpoints:
        for name in remove:
            shutil.rmtree(out / name, ignore_errors=True)
    return record


def model_facts(cfg, sample_shape, num_classes: int) -> dict:
    """Parameters (``pos_embed`` included, as the paper counts), forward multiply-adds per image in G (the paper's
    "Gflops") and tokens of the DiT the trainer builds from ``cfg`` for data of ``sample_shape`` (C, H, W) and
    ``num_classes``, counted on the meta device (:mod:`dit_core.measure.flops`)."""
    import torch

    from dit_core.measure.flops import model_facts as count
    from dit_core.models import DiT
    from dit_core.train.loop import dit_arguments

    with torch.device("meta"):
        model = DiT(**dit_arguments(cfg, tuple(sample_shape), num_classes), block=cfg.block)
    return count(model)


# ----------------------------------------------------------------------------------------------------------
# Several runs at a time
# ----------------------------------------------------------------------------------------------------------


def _in_worker(job: dict):
    """One job in a worker process, on one thread; a run stopped by a signal ends the worker (it saved)."""
    import torch

    torch.set_num_threads(1)
    try:
        return job["fn"](*job.get("args", ()), **job.get("kw", {}))
    except KeyboardInterrupt:
        os._exit(143)


def pass_on_stop(signum, frame):
    """SIGTERM (``kill PID``) reaches the main process only, and a pool's workers would train on without it: pass
    it on to the runs in progress, which save a checkpoint and stop, and stop too. The same command started again
    continues every run where it stopped."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
    raise SystemExit(f"study: stopped by signal {signum}; the runs in progress saved their checkpoints "
                     "(start the same command again to continue them)")


def run_jobs(jobs: list[dict], n: int = 1, done=None) -> list:
    """Run ``jobs`` (each ``{"fn": a module-level function, "args": (...), "kw": {...}}``), ``n`` at a time in
    worker processes on one thread each (``n`` <= 1: here, in order); ``done(result)`` is called as each ends.
    Returns the results in the order they ended. ``kill`` of this process stops the workers, which save."""
    import signal

    results = []

    def finished(result):
        results.append(result)
        if done:
            done(result)

    if n <= 1 or len(jobs) <= 1:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for job in jobs:
                finished(job["fn"](*job.get("args", ()), **job.get("kw", {})))
        finally:
            torch.set_num_threads(threads)
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    previous = signal.signal(signal.SIGTERM, pass_on_stop) if _main_thread() else None
    try:
        with ProcessPoolExecutor(max_workers=min(n, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
            for future in as_completed([pool.submit(_in_worker, job) for job in jobs]):
                finished(future.result())
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return results


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def environment() -> dict:
    """The machine a study ran on: Python, torch, the CPU's features, the load and the date."""
    import platform

    import torch

    from dit_core.measure.env import cpu_info

    return {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu_info(),
            "machine": platform.machine(), "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}


# ----------------------------------------------------------------------------------------------------------
# Reading records
# ----------------------------------------------------------------------------------------------------------

#: The scaling grid's sizes as its committed record names them (S, B, L, which read as DiT's much larger
#: configurations), and as the code names them, by depth and width.
RECORD_SIZE_NAMES = {"S": "d2w64", "B": "d3w96", "L": "d4w128"}


def code_name(variant: str) -> str:
    """The code's name of a variant a record names: ``"S/4"`` -> ``"d2w64/4"`` (:data:`RECORD_SIZE_NAMES`); other
    names unchanged."""
    size, sep, patch = variant.partition("/")
    return f"{RECORD_SIZE_NAMES[size]}/{patch}" if sep and size in RECORD_SIZE_NAMES else variant


def load_records(path: str | os.PathLike) -> dict:
    """A study's results file (``runs``, ``settings``, ``environment``, ...), its runs' variant names read as the code
    names them (:func:`code_name`); the file's ``labels`` (``{name in the file: name}``, for runs of a design whose
    name the code gives to another) relabel its runs too."""
    data = json.loads(Path(path).read_text())
    labels = data.get("labels", {})
    for run in data.get("runs", []):
        if "variant" in run:
            run["variant"] = labels.get(run["variant"], code_name(run["variant"]))
    variants = data.get("settings", {}).get("variants")
    if isinstance(variants, dict):
        data["settings"]["variants"] = {labels.get(v, code_name(v)): s for v, s in variants.items()}
    return data


def spread(values) -> dict:
    """Median, min and max of the finite ``values`` (over seeds), and how many there are."""
    values = sorted(v for v in values if v is not None and math.isfinite(v))
    if not values:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "seeds": 0}
    return {"median": statistics.median(values), "min": values[0], "max": values[-1], "seeds": len(values)}


def curve(runs: list[dict], key: str) -> list[dict]:
    """:func:`spread` over ``runs`` of ``key`` at every scored step."""
    steps = sorted({e["step"] for r in runs for e in r["evals"]})
    return [{"step": s, **spread([next((e.get(key) for e in r["evals"] if e["step"] == s), None) for r in runs])}
            for s in steps]


def plot_curves(records: list[dict], group: str = "variant", x: str = "step", keys=("frechet_distance",
                "class_accuracy"), ax=None, xvalue=None, styles=None, labels=None, hline=None):
    """``keys`` against ``x`` per ``group`` (a record key: "variant" or "method"), one panel per key: the median
    over seeds, the range over seeds shaded. ``x``: "step", "seconds" (the training seconds at each step) or
    anything ``xvalue(record_group_runs, step)`` computes; ``styles`` and ``labels`` by group; ``hline``: {key:
    value} reference lines. Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(1, len(keys), figsize=(12, 3.8))
    ax = list(np.atleast_1d(ax))
    fig = ax[0].figure
    names = {"frechet_distance": "FD (the judge's features)", "class_accuracy": "class accuracy",
             "class_effect": "the class's effect on the prediction"}
    groups = list(dict.fromkeys(r[group] for r in records))
    for i, name in enumerate(groups):
        runs = [r for r in records if r[group] == name and r["evals"]]
        if not runs:
            continue
        steps = sorted({e["step"] for r in runs for e in r["evals"]})
        if x == "step":
            xs = np.array(steps, dtype=float)
        elif x == "seconds":
            xs = np.array([spread([next((e.get("seconds") for e in r["evals"] if e["step"] == s), None)
                                   for r in runs])["median"] for s in steps])
        else:
            xs = np.array([xvalue(runs, s) for s in steps], dtype=float)
        style = {"color": f"C{i}", "lw": 1.6, "marker": "o", "ms": 3, **(styles or {}).get(name, {})}
        for a, key in zip(ax, keys):
            pts = curve(runs, key)
            a.plot(xs, [p["median"] for p in pts], label=(labels or {}).get(name, name), **style)
            if len(runs) > 1:
                a.fill_between(xs, [p["min"] for p in pts], [p["max"] for p in pts], color=style["color"], alpha=0.15)
    for a, key in zip(ax, keys):
        a.set_ylabel(names.get(key, key))
        if key == "frechet_distance":
            a.set_yscale("log")
        if hline and key in hline:
            a.axhline(hline[key], color="grey", lw=0.8, ls=":")
        a.set_xlabel({"step": "training step", "seconds": "training seconds (one CPU thread)"}.get(
            x, "training compute (Gflop, 3 x Gflops x batch x steps)"))
        if x not in ("step", "seconds"):
            a.set_xscale("log")
        a.grid(alpha=0.3)
    ax[-1].legend(fontsize=8, ncol=1 if len(groups) < 6 else 2)
    fig.tight_layout()
    return fig
