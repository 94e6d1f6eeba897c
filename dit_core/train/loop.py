"""The DiT training loop, top to bottom (Peebles & Xie 2023, Sec. 4 "Training"; the official ``train.py``).

:func:`train` reads like a script: set up the processes and the device, open the data, build the model,
its EMA, AdamW, the diffusion and the training step, resume if asked, then repeat for every step:

1. set the learning rate (optional warmup and cosine decay; the official run keeps 1e-4 constant);
2. run the step (:class:`dit_core.train.step.TrainStep`): draw its random numbers (timesteps, noise, label
   drops) from ``(seed, step)``; for each micro-batch drop labels to the null class (classifier-free
   guidance), compute the hybrid loss under autocast and backpropagate ``loss / grad_accum``; then unscale
   (fp16), clip, check for NaN/Inf, and apply the AdamW step and the EMA update, or skip the step;
3. log; save a checkpoint every ``ckpt_every`` steps (and every ``ckpt_every_minutes``); write a sample grid
   every ``sample_every`` steps; after SIGTERM, SIGUSR1 or Ctrl-C, save and stop (:mod:`.preempt`).

The loop reads numbers from the device only when it logs, saves or stops (:mod:`.guard` explains why), and
a checkpoint is a pure function of (config, seed, step): every random number comes from ``(seed, step)``, and
the global generators of torch, numpy and Python are seeded from the seed (per process) and stored, so a
resumed run stores exactly what an uninterrupted one does.

The helpers above :func:`train` make the decisions one at a time (which data, which model, which step);
each is a few lines long.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch

from ..diffusion import create_process
from ..models import DiT, model_kwargs
from ..runtime import compiler_missing, cpu_bf16_speedup, cpu_has_fast_bf16, resolve_precision, set_tf32
from . import distributed
from .batches import DataOrder, MicroBatches, describe, micro_batches, open_training_data
from .budget import TimeBudget
from .config import MODEL_SIZE_KEYS, ConfigError, TrainConfig, save_yaml, to_dict
from .ema import create_ema
from .grids import sample_grid
from .guard import TrainingDiverged
from .monitor import Monitor, write_summary
from .objectives import build_objective
from .optimizer import check_optimizer, make_optimizer
from .overrides import Overrides
from .preempt import StopSignals, ignore_stop_signals
from .preflight import check_before_training, recheck_for_length
from .state import Saved, load_checkpoint, resume_path, save_or_explain, seed_global_generators
from .step import StepOptions, TrainStep, compile_blocks

# ----------------------------------------------------------------------------------------------------------
# Decisions, one at a time
# ----------------------------------------------------------------------------------------------------------


def step_options(cfg: TrainConfig, precision: str) -> StepOptions:
    """How the training step runs, from the config (and the precision chosen for this device)."""
    return StepOptions(grad_accum=cfg.grad_accum, precision=precision, grad_clip=cfg.grad_clip,
                       max_bad_steps=cfg.max_bad_steps, ema_decay=cfg.ema_decay, ema_warmup=cfg.ema_warmup,
                       ema_every=cfg.ema_every)


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warmup over ``warmup_steps``, then constant or cosine decay to ``min_lr`` at ``max_steps``."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "cosine":
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr


def debug_config(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """``--debug``: 5 steps on a small subset with the configured micro-batch (so memory is checked)."""
    micro = max(1, cfg.batch_size // (cfg.grad_accum * world_size))
    batch = micro * world_size
    return dataclasses.replace(
        cfg, max_steps=min(cfg.max_steps, 5), batch_size=batch, grad_accum=1, subset=max(4 * batch, 16),
        log_every=1, ckpt_every=5, keep_every=0, sample_every=0, sample_per_class=1,
        sample_steps=min(cfg.sample_steps, 10), num_workers=min(cfg.num_workers, 2),
    )


def dit_arguments(cfg: TrainConfig, sample_shape, num_classes: int) -> dict:
    """The DiT's constructor arguments for this data: a named configuration with the config's overrides,
    sized to the data (its sample shape and class count)."""
    kwargs = model_kwargs(cfg.model)
    for key in ("depth", "hidden_size", "num_heads", "patch_size"):
        if getattr(cfg, key) is not None:
            kwargs[key] = getattr(cfg, key)
    channels, size, _ = sample_shape
    return dict(kwargs, input_size=size, in_channels=channels, num_classes=num_classes,
                class_dropout_prob=cfg.class_dropout_prob if num_classes else 0.0, learn_sigma=cfg.learn_sigma)


def build_model(cfg: TrainConfig, sample_shape, num_classes: int, show: bool = False) -> DiT:
    """The DiT for this data (:func:`dit_arguments`), with the configured attention and checkpointing; ``show``
    prints what is built, and which size keys given beside the model's name override its size."""
    model = DiT(**dit_arguments(cfg, sample_shape, num_classes), attn_backend=cfg.attn_backend,
                grad_checkpointing=cfg.grad_checkpointing, block=cfg.block)
    if show:
        named = model_kwargs(cfg.model)
        changed = [f"{k} {getattr(cfg, k)}" for k in MODEL_SIZE_KEYS
                   if getattr(cfg, k) is not None and getattr(cfg, k) != named[k]]
        print(f"model: {cfg.model}" + (f" with {', '.join(changed)} (set beside the name, overriding its size)"
                                        if changed else "")
              + f": {model.depth} {'' if model.block == 'adaln-zero' else model.block + ' '}blocks, width "
              f"{model.hidden_size}, {model.num_heads} heads, patch "
              f"{model.patch_size}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters", flush=True)
    return model


#: ``compile: auto`` compiles runs planned for at least this many steps: compiling the small-images step took
#: 12-40 s on a 2-core CPU (40 s with an empty cache) and then saved ~20 % of every step (122 against 152 ms).
COMPILE_MIN_STEPS = 1000


def should_compile(cfg: TrainConfig, device: torch.device, show: bool = True) -> bool:
    """Whether this run compiles its training step (``compile``: true, false, auto). ``auto`` compiles on the
    CPU when the run is long enough to repay the compilation (:data:`COMPILE_MIN_STEPS`) and a C++ compiler is
    there (else it says so and trains eagerly); on a GPU auto stays eager (not measured here: ``--compile true``)."""
    if cfg.compile != "auto":
        return cfg.compile == "true"
    if device.type != "cpu" or cfg.max_steps < COMPILE_MIN_STEPS:
        return False
    missing = compiler_missing(device)
    if missing and show:
        print(f"compile auto: off ({missing})", flush=True)
    if not missing and show:
        print("compile auto: compiling the training step (10-40 s before the first step, then ~20 % faster steps "
              "here; --compile false to skip)", flush=True)
    return missing is None


# ----------------------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------------------


def save_run_config(cfg: TrainConfig, out: Path, run_config: dict) -> None:
    """``<out>/config.yaml``: the settings, and under ``run:`` the facts of this run (precision, classes, ...)."""
    save_yaml(cfg, out / "config.yaml", extra={k: v for k, v in run_config.items() if k not in to_dict(cfg)})


def train(cfg: TrainConfig, dataset=None, overrides: Overrides | None = None) -> dict:
    """Train a DiT as ``cfg`` says and return the end-of-run summary (also in ``<out>/summary.json``).

    ``dataset`` replaces the data named in the config: anything with ``__len__``, ``__getitem__`` giving
    ``(x, label)``, and a ``num_classes`` attribute. With ``threads`` set, torch uses that many CPU threads for
    the run and the caller's setting comes back afterwards (a notebook's next cells keep theirs). ``overrides``:
    what the command line changed in the profile (:mod:`.overrides`), recorded in ``config.yaml``.
    """
    if not cfg.threads:
        return choose_guidance_after(cfg, _train(cfg, dataset, overrides), dataset)
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return choose_guidance_after(cfg, _train(cfg, dataset, overrides), dataset)
    finally:
        torch.set_num_threads(previous)


def choose_guidance_after(cfg: TrainConfig, summary: dict, dataset=None) -> dict:
    """With ``guidance_search``, once a pixel-folder run has trained to its end: its guidance chosen for its folder
    (:mod:`dit_core.eval.guidance`, in the main process, on every core the training processes used), recorded in
    ``<out>/guidance.json``; the summary gets ``guidance`` (scale and interval) and ``guidance_seconds``."""
    import os

    if not (cfg.guidance_search and not summary.get("interrupted") and dataset is None and cfg.latents_path is None and cfg.class_cond
            and int(os.environ.get("RANK", "0")) == 0 and not cfg.debug):
        return summary
    import json

    from ..eval.guidance import choose_guidance, format_choice
    from ..runtime import usable_cores
    from ..sample.files import GUIDANCE_FILE

    path = Path(cfg.out) / GUIDANCE_FILE
    done = json.loads(path.read_text()) if path.is_file() else {}
    if done.get("step") == summary.get("steps") and "chosen" in done:  # a finished run started again: its choice stands
        return {**summary, "guidance": done["chosen"], "guidance_seconds": 0.0}
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, min(usable_cores(), int(summary.get("processes") or 1) * threads)))
    try:
        record = choose_guidance(cfg.out, device=summary.get("device") or "cpu", per_class=cfg.guidance_per_class)
    except (FileNotFoundError, ValueError) as err:
        print(f"guidance search skipped: {err}", flush=True)
        return summary
    finally:
        torch.set_num_threads(threads)
    print(format_choice(record) + f"\n  ({record['seconds']:.0f} s; kept in {path}, "
          "which dit-sample uses)", flush=True)
    return {**summary, "guidance": record["chosen"], "guidance_seconds": record["seconds"]}


def start(cfg: TrainConfig):
    """``(procs, cfg, precision, out)``: the processes and device (DDP under torchrun), the config (``--debug``'s
    5 steps), the autocast precision and the run folder, with what cannot work said before anything is built."""
    check_optimizer(cfg)  # an optimizer this torch lacks (muon before torch 2.9), said before the processes start
    procs = distributed.setup(cfg.device)
    device = procs.device
    if cfg.debug:
        cfg = debug_config(cfg, procs.world_size)
    try:
        precision = resolve_precision(cfg.mixed_precision, device)
    except ValueError as err:
        raise ConfigError(f"{err} (--mixed-precision)") from None
    if procs.is_main and device.type == "cpu" and cfg.mixed_precision == "auto" and cpu_has_fast_bf16():
        print(f"mixed_precision auto: {precision} (a bf16 matmul measured {cpu_bf16_speedup():.2f}x fp32 on this "
              "CPU; --mixed-precision bf16|fp32 to choose)", flush=True)
    if device.type == "cuda":
        set_tf32(cfg.tf32)
    if cfg.batch_size % (cfg.grad_accum * procs.world_size) or cfg.batch_size < cfg.grad_accum * procs.world_size:
        raise ConfigError(f"batch_size {cfg.batch_size} must be a multiple of grad_accum x processes = "
                          f"{cfg.grad_accum} x {procs.world_size}")
    out = Path(cfg.out)
    if procs.is_main:
        out.mkdir(parents=True, exist_ok=True)
    return procs, cfg, precision, out


def resume_from(path: Path, cfg: TrainConfig, model, ema, opt, stepper, dataset, procs, extras) -> tuple:
    """Load a checkpoint into the run: ``(step, samples_seen, loss, budget_steps)``."""
    info = load_checkpoint(path, model=model, ema=ema, opt=opt, scaler=stepper.scaler, dataset_size=len(dataset),
                           seed=cfg.seed, restore_rng=procs.is_main, extras=extras)
    if info["config"].get("objective", "ddpm") != cfg.objective:
        raise ConfigError(f"cannot resume from {path}: it was trained with objective "
                          f"{info['config'].get('objective', 'ddpm')}, this run asks for {cfg.objective}")
    stepper.ema_updates = info["ema_updates"]
    # a time budget's decision is kept (dit_core.train.budget)
    return (info["step"], info["samples_seen"], float(info["metrics"].get("loss", float("nan"))),
            info["config"].get("budget_steps"))


@dataclasses.dataclass
class TrainingData:
    """The run's data (cut to ``subset``) and what the loop knows of it."""

    dataset: object
    sample_shape: tuple
    num_classes: int  # 0: unconditional
    classes: list
    is_latent: bool


def open_data(cfg: TrainConfig, out: Path, procs, dataset=None) -> TrainingData:
    """The data the config names (or ``dataset``), its sample shape and classes, cut to ``subset``."""
    dataset = open_training_data(cfg, out, procs) if dataset is None else dataset
    sample_shape, num_classes = describe(dataset)
    num_classes = num_classes if cfg.class_cond else 0
    classes = list(getattr(dataset, "classes", range(num_classes)))
    if cfg.subset:
        dataset = torch.utils.data.Subset(dataset, range(min(cfg.subset, len(dataset))))
    is_latent = hasattr(getattr(dataset, "dataset", dataset), "latent_shape")
    return TrainingData(dataset, sample_shape, num_classes, classes, is_latent)


@dataclasses.dataclass
class Parts:
    """What trains: the DiT, its EMA, the diffusion, the optimizer, the step, and what checkpoints keep beside
    the DiT (``extras``: the training-only parameters of :mod:`.objectives`)."""

    model: DiT
    ema: torch.nn.Module
    diffusion: object
    opt: torch.optim.Optimizer
    stepper: TrainStep
    extras: dict | None


def build_parts(cfg: TrainConfig, data: TrainingData, out: Path, procs, precision: str) -> Parts:
    """The model, its EMA, the diffusion, the objective, AdamW (or the configured optimizer) and the training step;
    an objective that needs features of the data replaces ``data.dataset`` with the data and its features."""
    device = procs.device
    torch.manual_seed(cfg.seed)  # the same initial weights on every process
    model = build_model(cfg, data.sample_shape, data.num_classes, show=procs.is_main).to(device)
    # The step drops labels itself from the seeded draws, so DiT's own random label dropout (active only in
    # train mode) is switched off with eval(): DiT has no dropout or batch-norm layers, so eval mode changes
    # nothing else.
    model.eval()
    ema = create_ema(model, device="cpu" if cfg.ema_device == "cpu" else None)
    # DiT's diffusion, or the linear interpolant of objective "flow" (dit_core.diffusion.flow)
    diffusion = create_process(cfg.objective, noise_schedule=cfg.noise_schedule, learn_sigma=cfg.learn_sigma,
                               diffusion_steps=cfg.diffusion_steps)
    # None with DiT's recipe; else the options of dit_core.train.objectives, their training-only parameters
    # (trained with the DiT, not part of it) and the teacher of representation alignment
    objective, data.dataset = build_objective(cfg, model, diffusion, data.dataset, out, procs, device)
    trained = objective.module if objective is not None else model
    opt = make_optimizer(trained, cfg, device, precision)
    if should_compile(cfg, device, procs.is_main):
        compile_blocks(model, trained)  # the module the step runs
    stepper = TrainStep(model, diffusion, opt, ema, step_options(cfg, precision), batch_size=cfg.batch_size,
                        seed=cfg.seed, procs=procs, train_model=distributed.wrap(trained, procs), objective=objective)
    return Parts(model, ema, diffusion, opt, stepper, objective.extras if objective is not None else None)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def report_overrides(overrides: Overrides, cfg: TrainConfig, data: TrainingData, model: DiT, show: bool) -> dict:
    """What the command line changed in the profile (:mod:`.overrides`) as ``config.yaml`` records it; when it
    resized the model, with both models' parameter counts for this data (the profile's counted on the meta
    device: nothing is allocated), which ``show`` prints."""
    record = overrides.record()
    if overrides.tuned_model is not None:
        tuned = dataclasses.replace(cfg, **{**{k: None for k in MODEL_SIZE_KEYS}, **overrides.tuned_model})
        with torch.device("meta"):
            before = parameter_count(DiT(**dit_arguments(tuned, data.sample_shape, data.num_classes)))
        now = parameter_count(model)
        record["parameters"] = {"profile_model": before, "this_run": now}
        if show:
            print(f"parameters: {now / 1e6:.2f} M in this run, {before / 1e6:.2f} M in the profile's model "
                  f"({now / before:.1f}x), whose settings this run keeps", flush=True)
    return record


def run_facts(cfg: TrainConfig, precision: str, procs, data: TrainingData, model: DiT, budget: TimeBudget,
              overrides: Overrides | None) -> dict:
    """What ``config.yaml`` (under ``run:``) and every checkpoint record beside the settings (the command line's
    ``overrides`` only in ``config.yaml``)."""
    return {**to_dict(cfg), "precision": precision, "world_size": procs.world_size,
            "num_classes": data.num_classes, "classes": [str(c) for c in data.classes],
            "sample_shape": list(data.sample_shape), "data_kind": "latents" if data.is_latent else "pixels",
            "architecture": {k: getattr(model, k) for k in MODEL_SIZE_KEYS}, "parameters": parameter_count(model),
            **({"budget_steps": budget.planned} if budget.planned is not None else {}),
            **({"overrides": report_overrides(overrides, cfg, data, model, procs.is_main)}
               if overrides is not None and overrides.changes else {})}


def save_checkpoints(out: Path, parts: Parts, cfg: TrainConfig, step: int, samples_seen: int, run_config: dict,
                     data: TrainingData, loss, train_seconds: float, saved: Saved) -> None:
    """``checkpoints/last.pt``, and a kept ``step_XXXXXXX.pt`` every ``keep_every`` steps."""
    ckpt = dict(model=parts.model, ema=parts.ema, opt=parts.opt, scaler=parts.stepper.scaler, step=step,
                samples_seen=samples_seen, ema_updates=parts.stepper.ema_updates,
                config={k: v for k, v in run_config.items() if k != "overrides"},  # the command line's, not the run's
                dataset_size=len(data.dataset), extras=parts.extras,
                metrics={"loss": float(loss), "train_seconds": train_seconds})
    keep = cfg.keep_every and step % cfg.keep_every == 0
    for name in ["last.pt"] + ([f"step_{step:07d}.pt"] if keep else []):
        save_or_explain(out / "checkpoints" / name, ckpt, saved, out)


def resume_and_budget(ckpt_path: Path | None, cfg: TrainConfig, parts: Parts, data: TrainingData, procs) -> tuple:
    """``(step, samples_seen, loss, budget)``: where the run starts (a checkpoint, if resumed) and its
    :class:`TimeBudget` (a resumed run keeps the length its budget decided)."""
    step, samples_seen, loss_value, budget_steps = 0, 0, float("nan"), None
    if ckpt_path is not None:
        step, samples_seen, loss_value, budget_steps = resume_from(ckpt_path, cfg, parts.model, parts.ema, parts.opt,
                                                                   parts.stepper, data.dataset, procs, parts.extras)
    device = procs.device
    budget = TimeBudget(cfg.max_minutes, cfg.max_steps, cfg.warmup_steps, step, budget_steps,
                        sync=lambda: torch.cuda.synchronize(device) if device.type == "cuda" else None)
    return step, samples_seen, loss_value, budget


def open_batches(cfg: TrainConfig, data: TrainingData, procs, step: int, samples_seen: int):
    """This process's micro-batches from ``step`` on (:mod:`.batches`: the order is a function of the seed)."""
    sampler = MicroBatches(DataOrder(len(data.dataset), cfg.seed), cfg.seed, cfg.batch_size, cfg.grad_accum,
                           procs.world_size, procs.rank, start_step=step, end_step=cfg.max_steps,
                           samples_seen=samples_seen)
    return micro_batches(data.dataset, sampler, data.sample_shape, preload_mode=cfg.preload,
                         num_workers=cfg.num_workers, device=procs.device, worker_init_fn=ignore_stop_signals)


def grid_due(cfg: TrainConfig, step: int) -> bool:
    """Whether a sample grid is written after ``step``: every ``sample_every`` steps, and at the end."""
    return bool((cfg.sample_every and step % cfg.sample_every == 0) or (step == cfg.max_steps and cfg.sample_at_end))


def budget_decided(cfg: TrainConfig, planned: TrainConfig, out: Path, run_config: dict, data: TrainingData,
                   findings: list, monitor: Monitor, procs) -> list:
    """A time budget has fixed the run's length (``cfg.max_steps``): recorded in ``config.yaml``, shown by the
    progress bar, and checked by pre-flight again; returns pre-flight's findings."""
    run_config["budget_steps"] = cfg.max_steps
    monitor.set_total(cfg.max_steps)
    if procs.is_main:
        save_run_config(cfg, out, run_config)
    return recheck_for_length(planned, cfg.max_steps, data.dataset, data.num_classes, findings, monitor)


def log_step(step: int, result, lr: float, stepper: TrainStep, monitor: Monitor, procs, read: bool,
             last: bool) -> None:
    """Hand the step's figures to the monitor (``last``: the run's last step, always logged); with ``read`` (a
    logging step) read the device first: the NaN guard's verdict (a run of bad steps raises
    :class:`TrainingDiverged`) and the loss terms, averaged over the processes."""
    if read:
        stepper.guard.read()
        result.terms = {k: float(distributed.mean_over_processes(v, procs)) for k, v in result.terms.items()}
    for message in stepper.guard.take_messages():
        monitor.write(message)
    monitor.update(step, result.loss, lr, result.grad_norm, stepper.guard.skipped, result.terms, force=last)


def _train(cfg: TrainConfig, dataset=None, overrides: Overrides | None = None) -> dict:
    t_start = time.perf_counter()
    planned = cfg  # what pre-flight checks: the run as configured, not --debug's 5 steps
    procs, cfg, precision, out = start(cfg)
    device = procs.device
    data = open_data(cfg, out, procs, dataset)
    findings = check_before_training(planned, data.dataset, data.num_classes, procs.is_main)
    parts = build_parts(cfg, data, out, procs, precision)
    model, ema, opt, stepper = parts.model, parts.ema, parts.opt, parts.stepper
    seed_global_generators(cfg.seed, procs.rank)  # per process (the step draws from its own generators)

    # -- resume, the time budget, the batches ---------------------------------------------------------------
    ckpt_path = resume_path(cfg, out)
    step, samples_seen, loss_value, budget = resume_and_budget(ckpt_path, cfg, parts, data, procs)
    cfg = dataclasses.replace(cfg, max_steps=budget.planned or cfg.max_steps)
    run_config = run_facts(cfg, precision, procs, data, model, budget, overrides)
    if procs.is_main:
        save_run_config(cfg, out, run_config)

    # -- the loop -----------------------------------------------------------------------------------------
    batches = open_batches(cfg, data, procs, step, samples_seen)  # before the log opens: a preload takes time, and
    # a stop signal before StopSignals below cannot save (a run whose log exists is expected to save when stopped)
    monitor = Monitor(out, procs.is_main, step, cfg.max_steps, cfg.batch_size, device, cfg.log_every,
                      cfg.tensorboard, cfg.progress)
    batches = monitor.timed(batches)  # data waits go into the log
    grids = sorted((out / "samples").glob("step_*.png")) if ckpt_path is not None else []
    start_step, last_grid, stopped = step, (grids[-1] if grids else None), None
    saved = Saved(step if ckpt_path is not None else None)
    t_loop = time.perf_counter()
    with StopSignals(procs) as stop:
        try:
            while step < cfg.max_steps:
                for group in opt.param_groups:  # 1. the learning rate
                    group["lr"] = lr = learning_rate(step, cfg)
                # 2-4. the step: its random numbers, the micro-batches, the checked update (dit_core.train.step)
                result = stepper(step, batches)
                step, samples_seen = step + 1, samples_seen + cfg.batch_size
                length, message = budget.check(step, cfg.max_steps, procs)  # a time budget: the run's length
                if length is not None:
                    cfg = dataclasses.replace(cfg, max_steps=length)
                    monitor.write(message)
                    if length == budget.planned:  # decided now: recorded, shown, and pre-flight checks it
                        findings = budget_decided(cfg, planned, out, run_config, data, findings, monitor, procs)
                stopped = stop.agreed()  # a stop signal (on any process): save and leave after this step

                # 5. log (the only place where the loop reads the device), checkpoint, sample
                last = step == cfg.max_steps or stopped is not None
                log_step(step, result, lr, stepper, monitor, procs, read=last or step % cfg.log_every == 0, last=last)
                if procs.is_main and (last or step % cfg.ckpt_every == 0
                                      or saved.minutes_ago() >= (cfg.ckpt_every_minutes or math.inf)):
                    with monitor.pause(), budget.pause():
                        save_checkpoints(out, parts, cfg, step, samples_seen, run_config, data, result.loss,
                                         time.perf_counter() - t_loop, saved)
                if stopped is not None:
                    break
                if procs.is_main and grid_due(cfg, step):
                    with monitor.pause(), budget.pause():
                        last_grid = sample_grid(ema, parts.diffusion, cfg, out, step, data.classes, data.is_latent,
                                                data.dataset, device)
                        if last_grid is not None:
                            monitor.image("samples", last_grid, step)
        except TrainingDiverged as err:
            monitor.write(str(err))
            raise
        finally:
            monitor.close()
            if stopped is None and step < cfg.max_steps:  # an error, or a second Ctrl-C
                if procs.is_main:
                    print(f"dit-train: stopped at step {step}; the last checkpoint is "
                          + (f"step {saved.step} ({out / 'checkpoints' / 'last.pt'})" if saved.step else "none"),
                          flush=True)
                distributed.cleanup(procs)
    summary = write_summary(out, cfg, procs, monitor, steps=step, steps_this_run=step - start_step, loss=loss_value,
                            skipped_steps=stepper.guard.skipped, started=t_start, loop_started=t_loop,
                            precision=precision, samples=last_grid, resumed_from=ckpt_path, interrupted=stopped)
    distributed.cleanup(procs)
    return summary
