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
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from ..atomic import DiskFullError, atomic_write_text
from ..diffusion import create_process
from ..models import DiT, model_kwargs
from ..runtime import compiler_missing, cpu_bf16_speedup, cpu_has_fast_bf16, resolve_precision, set_tf32
from . import distributed
from .batches import DataOrder, MicroBatches, SeededItems, derive_seed
from .budget import TimeBudget
from .config import ConfigError, TrainConfig, save_yaml, to_dict
from .ema import create_ema
from .grids import sample_grid
from .guard import TrainingDiverged
from .monitor import Monitor, format_summary, peak_memory_gb
from .objectives import build_objective
from .optimizer import make_optimizer
from .preempt import StopSignals, ignore_stop_signals
from .state import load_checkpoint, save_checkpoint
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


def open_training_data(cfg: TrainConfig, out: Path, procs):
    """The dataset named by the config: latents, an ImageFolder, or the digits (exported on first use)."""
    from ..latents import open_dataset

    path = cfg.latents_path or cfg.data_path
    if path is None:
        raise ConfigError(
            "no training data: pass --data-path ROOT (an ImageFolder: ROOT/<class>/<image>), --latents-path DIR "
            "(pre-extracted latents), or use --config digits, which needs no data"
        )
    if cfg.latents_path is None and str(cfg.data_path) == "digits":
        from ..data import export_digits

        path = out / "data" / "digits"
        if procs.is_main:
            export_digits(path)
        distributed.barrier(procs)
    path = Path(path).expanduser()
    if not path.exists():
        flag = "--latents-path" if cfg.latents_path else "--data-path"
        raise FileNotFoundError(
            f"training data not found: {flag} {str(path)!r} does not exist. Pass the folder that holds one "
            "sub-folder per class (ROOT/<class>/<image>, or ROOT/train/<class>/<image>), or a latent "
            "extraction folder; `dit-data check ROOT` checks an image folder."
        )
    mode = "L" if cfg.channels == 1 else "RGB"
    return open_dataset(path, image_size=cfg.image_size, mode=mode, flip=cfg.flip, split=None)


def describe(dataset) -> tuple[tuple[int, int, int], int]:
    """``(sample_shape, num_classes)`` of a dataset (attributes, else read off the first item)."""
    shape = getattr(dataset, "sample_shape", None) or tuple(dataset[0][0].shape)
    num_classes = getattr(dataset, "num_classes", None)
    if num_classes is None:
        raise ConfigError("the dataset must have a num_classes attribute (0 for unlabelled data)")
    if len(shape) != 3 or shape[1] != shape[2]:
        raise ConfigError(f"DiT trains on square (C, H, W) inputs; the dataset gives {shape}")
    return tuple(int(s) for s in shape), int(num_classes)


def is_deterministic(dataset) -> bool:
    """True when ``dataset[i]`` is always the same tensor (no flip, no latent posterior draw)."""
    base = dataset.dataset if isinstance(dataset, torch.utils.data.Subset) else dataset
    return not getattr(base, "flip", False) and not getattr(base, "sample", False)


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


def build_model(cfg: TrainConfig, sample_shape, num_classes: int) -> DiT:
    """The DiT for this data (:func:`dit_arguments`), with the configured attention and checkpointing."""
    return DiT(**dit_arguments(cfg, sample_shape, num_classes), attn_backend=cfg.attn_backend,
               grad_checkpointing=cfg.grad_checkpointing)


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


def seed_global_generators(seed: int, rank: int) -> None:
    """Seed torch's, numpy's and Python's global generators from the run's seed, one stream per process: the
    training draws its numbers from ``(seed, step)``, but whatever else draws from them (a library, code added
    to the loop) then starts from the same state in every run, and the checkpoint stores these states."""
    torch.manual_seed(seed + rank)
    np.random.seed(derive_seed(seed, rank, 11) % 2**32)
    random.seed(derive_seed(seed, rank, 12))


def resume_path(cfg: TrainConfig, out: Path) -> Path | None:
    """Which checkpoint to continue from, if any (see ``--resume``)."""
    last = out / "checkpoints" / "last.pt"
    resume = cfg.resume
    if isinstance(resume, str) and resume.lower() in ("true", "yes", "1"):
        resume = True
    if isinstance(resume, str) and resume.lower() in ("false", "no", "0", ""):
        resume = False
    if resume is False:
        if last.exists():
            raise ConfigError(
                f"{out} already holds a run ({last} exists): pass --resume true to continue it, or choose "
                "another --out folder to start a new one"
            )
        return None
    if resume == "auto":
        return last if last.exists() else None
    path = last if resume is True else Path(resume)
    if not path.exists():
        raise FileNotFoundError(f"nothing to resume: no checkpoint at {path}")
    return path


def flips_only(dataset) -> bool:
    """True when ``dataset[i]`` varies only by a horizontal flip (an image folder with ``flip`` on): its items
    can be kept in memory unflipped and flipped per item (:func:`flipped_batch`)."""
    base = dataset.dataset if isinstance(dataset, torch.utils.data.Subset) else dataset
    return bool(getattr(base, "flip", False)) and not getattr(base, "sample", False) and hasattr(base, "load")


def unflipped(dataset):
    """The same dataset with flips off (a shallow copy; the caller's dataset is left as it is)."""
    import copy

    if isinstance(dataset, torch.utils.data.Subset):
        return torch.utils.data.Subset(unflipped(dataset.dataset), dataset.indices)
    view = copy.copy(dataset)
    view.flip = False
    return view


def item_flips(seeds) -> torch.Tensor:
    """Whether each item is flipped: the first draw of torch's generator seeded with the item's seed, as
    :class:`~dit_core.train.batches.SeededItems` reading an image folder decides it (``torch.rand(()) < 0.5``)."""
    return torch.tensor([bool(torch.rand((), generator=torch.Generator().manual_seed(int(s))) < 0.5) for s in seeds],
                        dtype=torch.bool)


def flipped_batch(x_all: torch.Tensor, y_all: torch.Tensor, items) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch ``items`` (``(index, seed)`` pairs) from unflipped preloaded tensors, each image flipped as
    the data loader would have flipped it: the same batches, without decoding the files at every step."""
    index = [i for i, _ in items]
    x, flips = x_all[index], item_flips([s for _, s in items]).to(x_all.device)
    return torch.where(flips[:, None, None, None], x.flip(-1), x), y_all[index]


def preload(dataset, device: torch.device):
    """Every item of a small deterministic dataset, as two tensors on ``device``."""
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
    return torch.stack(xs).to(device), torch.as_tensor(ys, dtype=torch.long).to(device)


# ----------------------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------------------


def check_before_training(cfg: TrainConfig, dataset, num_classes: int, show: bool = True) -> list:
    """Pre-flight (:mod:`dit_core.train.preflight`): print what cannot work in this run, with the key and the
    fix, before the first step; raise a :class:`ConfigError` for the findings that are certain to fail. Every
    process checks (the check is pure and reads a few file headers), so all of them stop together; only the
    main process prints. Returns the findings."""
    from .preflight import DatasetFacts, errors, format_findings, preflight

    if cfg.debug:  # the facts of the whole dataset, not of --debug's subset
        dataset = dataset.dataset if isinstance(dataset, torch.utils.data.Subset) else dataset
    findings = preflight(cfg, DatasetFacts.of(dataset, num_classes))
    fatal = errors(findings)
    if fatal:
        raise ConfigError("pre-flight: this run cannot work:\n" + format_findings(fatal))
    if findings and show:
        print(format_findings(findings), flush=True)
    return findings


def save_run_config(cfg: TrainConfig, out: Path, run_config: dict) -> None:
    """``<out>/config.yaml``: the settings, and under ``run:`` the facts of this run (precision, classes, ...)."""
    save_yaml(cfg, out / "config.yaml", extra={k: v for k, v in run_config.items() if k not in to_dict(cfg)})


#: Steps between two looks at the clock for a time budget's deadline (under torchrun each look is a collective).
BUDGET_CHECK_EVERY = 10


def budget_spent(budget: TimeBudget, procs) -> bool:
    """Whether the time budget's minutes are spent, by the main process's clock (only it leaves the grids and
    checkpoints it writes out of the budget; the others wait for it meanwhile): all processes end together."""
    return bool(distributed.max_over_processes(float(budget.spent()) if procs.is_main else 0.0, procs))


def recheck_for_length(planned: TrainConfig, steps: int, dataset, num_classes: int, shown: list, monitor) -> list:
    """Pre-flight again once a time budget has fixed the run's length (the checks that count steps could not
    know it before the first step): writes the findings not shown before; returns all of them."""
    from .preflight import DatasetFacts, format_findings, preflight

    if planned.debug or steps >= planned.max_steps:  # the cap, which the first check saw, rules: nothing new
        return shown
    findings = preflight(dataclasses.replace(planned, max_steps=steps), DatasetFacts.of(dataset, num_classes),
                         budgeted=True)
    new = [f for f in findings if f not in shown and f.level == "warning"]
    if new:
        monitor.write(format_findings(new))
    return findings


def train(cfg: TrainConfig, dataset=None) -> dict:
    """Train a DiT as ``cfg`` says and return the end-of-run summary (also in ``<out>/summary.json``).

    ``dataset`` replaces the data named in the config: anything with ``__len__``, ``__getitem__`` giving
    ``(x, label)``, and a ``num_classes`` attribute. With ``threads`` set, torch uses that many CPU threads for
    the run and the caller's setting comes back afterwards (a notebook's next cells keep theirs).
    """
    if not cfg.threads:
        return _train(cfg, dataset)
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, dataset)
    finally:
        torch.set_num_threads(previous)


def _train(cfg: TrainConfig, dataset=None) -> dict:
    t_start = time.perf_counter()
    procs = distributed.setup(cfg.device)
    device = procs.device
    planned = cfg  # what pre-flight checks: the run as configured, not --debug's 5 steps
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
    micro_batch, rem = divmod(cfg.batch_size, cfg.grad_accum * procs.world_size)
    if rem or micro_batch < 1:
        raise ConfigError(
            f"batch_size {cfg.batch_size} must be a multiple of grad_accum x processes = {cfg.grad_accum} x "
            f"{procs.world_size}"
        )
    out = Path(cfg.out)
    if procs.is_main:
        out.mkdir(parents=True, exist_ok=True)

    # -- data ---------------------------------------------------------------------------------------------
    if dataset is None:
        dataset = open_training_data(cfg, out, procs)
    sample_shape, num_classes = describe(dataset)
    num_classes = num_classes if cfg.class_cond else 0
    classes = list(getattr(dataset, "classes", range(num_classes)))
    if cfg.subset:
        dataset = torch.utils.data.Subset(dataset, range(min(cfg.subset, len(dataset))))
    is_latent = hasattr(getattr(dataset, "dataset", dataset), "latent_shape")
    findings = check_before_training(planned, dataset, num_classes, procs.is_main)

    # -- model, EMA, optimizer, diffusion, the step --------------------------------------------------------
    torch.manual_seed(cfg.seed)  # the same initial weights on every process
    model = build_model(cfg, sample_shape, num_classes).to(device)
    # The step drops labels itself from the seeded draws, so DiT's own random label dropout (active only in
    # train mode) is switched off with eval(): DiT has no dropout or batch-norm layers, so eval mode changes
    # nothing else.
    model.eval()
    ema = create_ema(model, device="cpu" if cfg.ema_device == "cpu" else None)
    # DiT's diffusion, or the linear interpolant of objective "flow" (dit_core.diffusion.flow)
    diffusion = create_process(cfg.objective, noise_schedule=cfg.noise_schedule, learn_sigma=cfg.learn_sigma,
                               diffusion_steps=cfg.diffusion_steps, flow_prediction=cfg.flow_prediction)
    # None with DiT's recipe; else the options of dit_core.train.objectives, their training-only parameters
    # (trained with the DiT, not part of it) and the teacher of representation alignment
    objective, dataset = build_objective(cfg, model, diffusion, dataset, out, procs, device)
    trained = objective.module if objective is not None else model
    opt = make_optimizer(trained, cfg, device, distributed=procs.distributed, precision=precision)
    if should_compile(cfg, device, procs.is_main):
        compile_blocks(model, trained)  # compiles the module that the step runs
    train_model = distributed.wrap(trained, procs)  # DistributedDataParallel under torchrun
    stepper = TrainStep(model, diffusion, opt, ema, step_options(cfg, precision), batch_size=cfg.batch_size,
                        seed=cfg.seed, procs=procs, train_model=train_model, objective=objective)
    extras = objective.extras if objective is not None else None  # saved in checkpoints beside the DiT
    seed_global_generators(cfg.seed, procs.rank)  # per process (the step draws from its own generators)

    # -- resume -------------------------------------------------------------------------------------------
    step, samples_seen, loss_value, budget_steps = 0, 0, float("nan"), None
    ckpt_path = resume_path(cfg, out)
    if ckpt_path is not None:
        info = load_checkpoint(ckpt_path, model=model, ema=ema, opt=opt, scaler=stepper.scaler,
                               dataset_size=len(dataset), seed=cfg.seed, restore_rng=procs.is_main, extras=extras)
        if info["config"].get("objective", "ddpm") != cfg.objective:
            raise ConfigError(f"cannot resume from {ckpt_path}: it was trained with objective "
                              f"{info['config'].get('objective', 'ddpm')}, this run asks for {cfg.objective}")
        if info["config"].get("flow_prediction", "velocity") != cfg.flow_prediction:
            raise ConfigError(f"cannot resume from {ckpt_path}: its network predicts the "
                              f"{info['config'].get('flow_prediction', 'velocity')}, this run asks for "
                              f"flow_prediction {cfg.flow_prediction}")
        step, samples_seen, stepper.ema_updates = info["step"], info["samples_seen"], info["ema_updates"]
        loss_value = float(info["metrics"].get("loss", loss_value))
        budget_steps = info["config"].get("budget_steps")  # a time budget's decision: kept (dit_core.train.budget)
    budget = TimeBudget(cfg.max_minutes, cfg.max_steps, cfg.warmup_steps, step, budget_steps,
                        sync=lambda: torch.cuda.synchronize(device) if device.type == "cuda" else None)
    if budget.planned is not None:
        cfg = dataclasses.replace(cfg, max_steps=budget.planned)
    run_config = {**to_dict(cfg), "precision": precision, "world_size": procs.world_size,
                  "num_classes": num_classes, "classes": [str(c) for c in classes],
                  "sample_shape": list(sample_shape), "data_kind": "latents" if is_latent else "pixels",
                  **({"budget_steps": budget.planned} if budget.planned is not None else {})}
    if procs.is_main:
        save_run_config(cfg, out, run_config)

    # -- batches ------------------------------------------------------------------------------------------
    order = DataOrder(len(dataset), cfg.seed)
    sampler = MicroBatches(order, cfg.seed, cfg.batch_size, cfg.grad_accum, procs.world_size, procs.rank,
                           start_step=step, end_step=cfg.max_steps, samples_seen=samples_seen)
    # Small datasets are kept in memory (decoded once); an image folder with flips is kept unflipped and each
    # item flipped from its seed, exactly as the data loader would (measured: 13 % of the step spent decoding
    # 32 px files at 1.6 steps/s on one core).
    use_preload = cfg.preload == "true" or (cfg.preload == "auto" and (is_deterministic(dataset) or flips_only(dataset))
                                            and len(dataset) * math.prod(sample_shape) * 4 < 2**28)
    if use_preload and flips_only(dataset):
        x_all, y_all = preload(unflipped(dataset), device)
        micro_batches = (flipped_batch(x_all, y_all, items) for items in sampler)
    elif use_preload:
        if not is_deterministic(dataset):
            raise ConfigError("preload keeps one copy of every item, which would freeze random flips; use "
                              "--flip false or --preload false")
        x_all, y_all = preload(dataset, device)
        micro_batches = ((x_all[[i for i, _ in items]], y_all[[i for i, _ in items]]) for items in sampler)
    else:
        loader = torch.utils.data.DataLoader(
            SeededItems(dataset), batch_sampler=sampler, num_workers=cfg.num_workers,
            pin_memory=device.type == "cuda", persistent_workers=False, worker_init_fn=ignore_stop_signals,
            # its own generator: creating the iterator then draws nothing from torch's global one
            generator=torch.Generator().manual_seed(derive_seed(cfg.seed, procs.rank, 13)),
        )
        micro_batches = iter(loader)

    # -- the loop -----------------------------------------------------------------------------------------
    monitor = Monitor(out, procs.is_main, step, cfg.max_steps, cfg.batch_size, device, cfg.log_every,
                      cfg.tensorboard, cfg.progress)
    micro_batches = monitor.timed(micro_batches)  # the time the step waits for data goes into the log
    grids = sorted((out / "samples").glob("step_*.png")) if ckpt_path is not None else []
    start_step, last_grid = step, (grids[-1] if grids else None)
    saved = Saved(step if ckpt_path is not None else None, time.monotonic())
    stopped = None
    t_loop = time.perf_counter()
    with StopSignals(procs) as stop:
        try:
            while step < cfg.max_steps:
                # 1. learning rate
                lr = learning_rate(step, cfg)
                for group in opt.param_groups:
                    group["lr"] = lr
                # 2-4. the step: its random numbers, the micro-batches, the checked update (dit_core.train.step)
                result = stepper(step, micro_batches)
                step += 1
                samples_seen += cfg.batch_size
                decided = budget.after_step(step)  # a time budget fixes the run's length once, in the warm-up
                if decided is not None:
                    # under torchrun every process decides at this step; the slowest one's length holds for all
                    decided = budget.planned = int(-distributed.max_over_processes(-decided, procs))
                    cfg = dataclasses.replace(cfg, max_steps=decided)
                    run_config["budget_steps"] = decided
                    monitor.set_total(decided)
                    if procs.is_main:
                        monitor.write(budget.describe())
                        save_run_config(cfg, out, run_config)
                    findings = recheck_for_length(planned, decided, dataset, num_classes, findings, monitor)
                elif (budget.step_s is not None and step < cfg.max_steps and step % BUDGET_CHECK_EVERY == 0
                      and budget_spent(budget, procs)):  # the session that decided the length: its deadline
                    monitor.write(f"time budget {cfg.max_minutes:g} min spent at step {step} of {cfg.max_steps} (the "
                                  "steps became slower than measured): the run ends here; --resume true trains on to "
                                  f"step {cfg.max_steps}")
                    cfg = dataclasses.replace(cfg, max_steps=step)
                stopped = stop.agreed()  # a stop signal (on any process): save and leave after this step

                # 5. log (the only place where the loop reads the device), checkpoint, sample
                log_now = step % cfg.log_every == 0 or step == cfg.max_steps or stopped is not None
                if log_now:
                    stepper.guard.read()  # reports skipped steps; a run of bad ones raises TrainingDiverged
                for message in stepper.guard.take_messages():
                    monitor.write(message)
                extra = {k: float(distributed.mean_over_processes(v, procs)) for k, v in result.terms.items()
                         if log_now}  # the loss terms, averaged over processes
                monitor.update(step, result.loss, lr, result.grad_norm, stepper.guard.skipped, extra,
                               force=step == cfg.max_steps or stopped is not None)
                save_now = (step % cfg.ckpt_every == 0 or step == cfg.max_steps or stopped is not None
                            or saved.minutes_ago() >= (cfg.ckpt_every_minutes or math.inf))
                if procs.is_main and save_now:
                    with monitor.pause(), budget.pause():
                        ckpt = dict(model=model, ema=ema, opt=opt, scaler=stepper.scaler, step=step,
                                    samples_seen=samples_seen, ema_updates=stepper.ema_updates, config=run_config,
                                    dataset_size=len(dataset),
                                    metrics={"loss": float(result.loss), "train_seconds": time.perf_counter() - t_loop},
                                    extras=extras)
                        names = ["last.pt"] + ([f"step_{step:07d}.pt"] if cfg.keep_every and step % cfg.keep_every == 0
                                               else [])
                        for name in names:
                            save_or_explain(out / "checkpoints" / name, ckpt, saved, out)
                        saved.step, saved.time = step, time.monotonic()
                if stopped is not None:
                    break
                grid_now = cfg.sample_every and step % cfg.sample_every == 0
                if procs.is_main and (grid_now or (step == cfg.max_steps and cfg.sample_at_end)):
                    with monitor.pause(), budget.pause():
                        last_grid = sample_grid(ema, diffusion, cfg, out, step, classes, is_latent, dataset, device)
                        if last_grid is not None:
                            monitor.image("samples", last_grid, step)
        except TrainingDiverged as err:
            monitor.write(str(err))
            raise
        finally:
            monitor.close()
            if procs.is_main and stopped is None and step < cfg.max_steps:  # an error, or a second Ctrl-C
                print(f"dit-train: stopped at step {step}; the last checkpoint is "
                      + (f"step {saved.step} ({out / 'checkpoints' / 'last.pt'})" if saved.step else "none"),
                      flush=True)
            if stopped is None and step < cfg.max_steps:
                distributed.cleanup(procs)
    train_seconds = time.perf_counter() - t_loop

    steps_done = step - start_step
    summary = {
        "steps": step,
        "steps_this_run": steps_done,
        "final_loss": (monitor.last_record or {}).get("loss", loss_value),  # the last logged average
        "skipped_steps": stepper.guard.skipped,
        "wall_seconds": time.perf_counter() - t_start,
        "train_seconds": train_seconds,
        "images_per_s": steps_done * cfg.batch_size / train_seconds if steps_done else 0.0,
        "precision": precision,
        "device": str(device),
        "threads": torch.get_num_threads(),  # torch's CPU threads (the config's threads, if set)
        "processes": procs.world_size,
        "peak_memory_gb": peak_memory_gb(device),
        "checkpoint": str(out / "checkpoints" / "last.pt"),
        "samples": str(last_grid) if last_grid else None,
        "resumed_from": str(ckpt_path) if ckpt_path else None,
        "interrupted": stopped,
    }
    if procs.is_main:
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        print(format_summary(summary), flush=True)
        if stopped is not None:
            print(f"\nstopped by {stopped} after step {step} of {cfg.max_steps}: checkpoint saved to "
                  f"{out / 'checkpoints' / 'last.pt'}.\nContinue with: dit-train --config {out / 'config.yaml'} "
                  "--resume true", flush=True)
    distributed.cleanup(procs)
    return summary


class Saved:
    """When the last checkpoint was written: its step (None: none yet) and its ``time.monotonic()``."""

    def __init__(self, step: int | None, when: float):
        self.step, self.time = step, when

    def minutes_ago(self) -> float:
        return (time.monotonic() - self.time) / 60


def save_or_explain(path: Path, ckpt: dict, saved: Saved, out: Path) -> None:
    """:func:`save_checkpoint`; on a full disk, say which checkpoint is intact and how to continue."""
    try:
        save_checkpoint(path, **ckpt)
    except DiskFullError as err:
        last = out / "checkpoints" / "last.pt"
        if path.name != "last.pt":
            intact = f"The checkpoint {last} of this step (step {ckpt['step']}) was written and is intact."
        elif saved.step is not None:
            intact = f"The previous checkpoint {last} (step {saved.step}) is intact."
        else:
            intact = "No checkpoint of this run was written before, so nothing is lost but the steps so far."
        raise err.add(f"{intact} Free space on that disk (or copy the run folder to a larger one) and continue "
                      f"with: dit-train --config {out / 'config.yaml'} --resume true") from err.__cause__

