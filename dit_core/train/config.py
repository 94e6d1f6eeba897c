"""The training configuration: one flat, plain-data record, profiles in YAML, overrides from the command line.

Every setting of a run is a field of :class:`TrainConfig` with the official DiT default (AdamW, lr 1e-4,
no weight decay, global batch 256, EMA 0.9999, label dropout 0.1, linear schedule over 1000 steps). A
*profile* (``dit_core/configs/<name>.yaml``) changes some of them for a machine or a dataset; the command line
changes any of them again. The resolved record is written to ``<out>/config.yaml`` and into every checkpoint.

Names follow this library, with hyphens and underscores alike; the spellings of the official ``train.py`` and
of the single-GPU tutorials are accepted too, values are read by the fields' types, and an unknown name is an
error that suggests the nearest known ones (:mod:`dit_core.train.spelling`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from ..atomic import atomic_write_text
from .spelling import ALIASES, ConfigError, canonical_key, hint_types, read_value

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def _f(default, help: str):
    """A dataclass field with a help text (shown by ``dit-train --help``)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """All settings of a training run. Plain data: ``dataclasses.asdict(cfg)`` is what gets saved."""

    # -- data ---------------------------------------------------------------------------------------------
    data_path: str | None = _f(None, "ImageFolder root (pixel space) or a latent extraction folder; 'digits' "
                                      "exports scikit-learn's digits into <out>/data and trains on them")
    latents_path: str | None = _f(None, "folder of pre-extracted VAE latents (dit-extract-latents); "
                                        "takes precedence over data_path")
    image_size: int = _f(256, "image side in pixels (latent models see image_size / 8)")
    channels: int = _f(3, "pixel-space colour channels: 3 (RGB) or 1 (grayscale); latents bring their own")
    flip: bool | Literal["auto"] = _f(True, "random horizontal flips (the paper's only augmentation): true, false, or "
                                            "auto (an image folder: only the classes a mirror test finds unchanged "
                                            "by a mirror, dit_core.data.probe; latents: true); off for digits")
    crop: Literal["adm", "object"] = _f("adm", "how a file becomes a square (pixel folders): adm (the centre square, as "
                                               "DiT) or object (the square placed where the object is, "
                                               "dit_core.data.objects)")
    class_cond: bool = _f(True, "class-conditional (classes from the dataset folders); false: unconditional")
    num_workers: int = _f(4, "DataLoader worker processes (0: load in the training process)")
    preload: Literal["auto", "true", "false"] = _f("auto", "keep the whole dataset in memory: auto (small, deterministic datasets), "
                              "true, false")
    subset: int = _f(0, "train on the first N images only (0: all)")

    # -- model --------------------------------------------------------------------------------------------
    model: str = _f("DiT-XL/2", "a named configuration (DiT-S/8 ... DiT-XL/2); the fields below override it")
    depth: int | None = _f(None, "number of DiT blocks (default: from model)")
    hidden_size: int | None = _f(None, "token width (default: from model)")
    num_heads: int | None = _f(None, "attention heads (default: from model)")
    patch_size: int | None = _f(None, "patch side p (default: from model)")
    learn_sigma: bool = _f(True, "predict the variance too (hybrid loss, as DiT)")
    class_dropout_prob: float = _f(0.1, "label dropout for classifier-free guidance")
    attn_backend: Literal["sdpa", "math", "xformers"] = _f("sdpa", "attention kernel: sdpa, math, xformers")
    block: Literal["adaln-zero", "adaln", "cross-attention", "in-context", "cross-attention-raw"] = _f(
        "adaln-zero", "block design (the paper's Fig. 5): adaln-zero (DiT's own), adaln (no gates), cross-attention "
                      "(over the normalised [t, y] tokens; cross-attention-raw: unnormalised), in-context (t and y "
                      "as two extra tokens)")
    grad_checkpointing: bool | int = _f(False, "recompute block activations in backward: true (all "
                                               "blocks), false, or the number of blocks counted from the first")

    # -- diffusion ----------------------------------------------------------------------------------------
    diffusion_steps: int = _f(1000, "T of the forward process")
    noise_schedule: Literal["linear", "squaredcos_cap_v2", "cosine"] = _f("linear", "beta schedule: linear (DiT) or squaredcos_cap_v2")

    # -- converging faster (dit_core.train.objectives; each off by default: DiT's own recipe) ---------------
    objective: Literal["ddpm", "flow"] = _f("ddpm", "ddpm: DiT's noise prediction and hybrid loss; flow: the linear "
                                                    "interpolant with velocity prediction (SiT; needs --learn-sigma "
                                                    "false, samples with euler/heun/euler-maruyama)")
    timestep_sampling: Literal["uniform", "logit_normal"] = _f("uniform", "training times: uniform, or logit_normal "
                                                                        "t = sigmoid(n), n ~ N(logit_mean, logit_std) "
                                                                        "(SD3); ddpm uses step floor(t T)")
    logit_mean: float = _f(0.0, "mean of n for logit_normal timestep sampling")
    logit_std: float = _f(1.0, "standard deviation of n for logit_normal timestep sampling")
    loss_weighting: Literal["none", "min_snr"] = _f("none", "none, or min_snr: weight min(SNR, gamma)/SNR on the "
                                                            "noise MSE (its velocity form with flow)")
    min_snr_gamma: float = _f(5.0, "gamma of min_snr loss weighting")
    mask_ratio: float = _f(0.0, "share of tokens dropped from the encoder blocks in training (MaskDiT: 0.5; 0: off)")
    mask_decoder_depth: int = _f(1, "with masking: the last N DiT blocks act as the decoder that sees all tokens")
    mae_weight: float = _f(0.1, "with masking: weight of the reconstruction loss on the masked tokens")
    mask_finetune_steps: int = _f(0, "with masking: train the last N steps without masking")
    repa_weight: float = _f(0.0, "weight of representation alignment (REPA: 0.5; 0: off)")
    repa_depth: int = _f(8, "REPA: align the tokens after this block (counted from 1; REPA: 8 for XL, 4 for B)")
    repa_projector_dim: int = _f(2048, "REPA: hidden width of the projector MLP")
    repa_teacher: str = _f("auto", "REPA's teacher: auto (pixels: cnn; latents: the one feature set extracted "
                                   "beside them), cnn (a small CNN fitted on the training images), a "
                                   "dinov2-vit?14 name or .pth (pixels), or a feature folder (latents)")

    # -- optimisation -------------------------------------------------------------------------------------
    max_steps: int = _f(400_000, "optimizer steps to train for (the run ends there)")
    max_minutes: float = _f(0.0, "time budget: the run times its first steps and trains as many steps as fit in "
                                 "this many minutes (at most max_steps; kept on --resume); 0: off")
    reference_steps: int = _f(0, "the run length a profile's figures were measured at: the pre-flight check "
                                 "warns when this run (a time budget's plan included) has fewer than 3/4 of "
                                 "them, and says how to train them; 0: no such figure")
    batch_size: int = _f(256, "global batch: images per optimizer step, over all processes and accumulation")
    grad_accum: int = _f(1, "micro-batches accumulated per step; micro-batch = batch_size / (grad_accum x "
                            "processes)")
    optimizer: Literal["adamw", "adamw8bit", "muon"] = _f(
        "adamw", "adamw (PyTorch's, as the paper), adamw8bit (bitsandbytes' 8-bit AdamW, 6 bytes per parameter "
        "less; pip install -e \".[lowmem]\") or muon (orthogonalised momentum for the blocks' matrices, AdamW "
        "for the rest, at the same lr: dit_core.train.muon)")
    lr: float = _f(1e-4, "learning rate (peak, after warmup); with muon, of both halves")
    weight_decay: float = _f(0.0, "decoupled weight decay (AdamW; with muon, both halves)")
    adam_betas: list = _f([0.9, 0.999], "AdamW betas")
    lr_schedule: Literal["constant", "cosine"] = _f("constant", "constant (official) or cosine (decay to min_lr at max_steps)")
    warmup_steps: int = _f(0, "linear learning-rate warmup from 0 over this many steps")
    min_lr: float = _f(0.0, "final learning rate of the cosine schedule")
    grad_clip: float = _f(0.0, "clip the global gradient norm to this value (0: no clipping)")
    fused_adam: Literal["auto", "true", "false"] = _f("auto", "fused AdamW kernel: auto (when the device supports it), true, false")
    ema_decay: float = _f(0.9999, "decay of the exponential moving average of the weights")
    ema_warmup: bool = _f(False, "ramp the EMA decay as min(decay, (1+n)/(10+n)) for short runs")
    ema_device: Literal["same", "cpu"] = _f("same", "where the EMA weights live: same (as the model) or cpu (saves GPU memory)")
    ema_every: int = _f(1, "update the EMA every N optimizer steps with the decay raised to N (the same "
                           "average; cheaper with the EMA on the CPU)")
    mixed_precision: Literal["auto", "bf16", "fp16", "fp32"] = _f("auto", "bf16, fp16 (with a gradient scaler), fp32, or auto: bf16 on GPUs that "
                                      "have it and on CPUs where a bf16 matmul measures faster (AMX, some AVX512-BF16), fp16 on older GPUs, else fp32")
    tf32: bool = _f(True, "allow TF32 matmuls on Ampere and newer GPUs")
    compile: Literal["auto", "true", "false"] = _f("false", "torch.compile the training step: true, false, or auto (on the "
                                                   "CPU, for runs of 1,000+ steps, when a C++ compiler is found)")
    seed: int = _f(0, "global seed: data order, noise, timesteps and label dropout all derive from it")
    max_bad_steps: int = _f(5, "stop with a diagnosis after this many consecutive steps skipped for "
                               "NaN/Inf")
    device: str = _f("auto", "cuda, cpu, cuda:1, mps, or auto")
    cpu_processes: int = _f(1, "on the CPU, train in this many processes (DDP over gloo), started by dit-train "
                               "itself, the cores shared among them; 0: one per usable core. A small model "
                               "uses 2 cores better as 2 processes than as 2 threads (dit_core.cli.train.run_processes)")
    threads: int = _f(0, "torch's CPU threads for this run (0: leave torch's default, or OMP_NUM_THREADS); a "
                         "small model on a CPU can run faster on 1 thread than on 2")

    # -- output and monitoring ----------------------------------------------------------------------------
    out: str = _f("runs/dit", "run folder: config.yaml, checkpoints/, samples/, metrics.jsonl, tb/")
    resume: str | bool = _f(False, "true: continue from <out>/checkpoints/last.pt; auto: if it exists; or a "
                                   "checkpoint path")
    log_every: int = _f(100, "steps between log lines and metric records")
    ckpt_every: int = _f(5000, "steps between checkpoints (last.pt; the last step is always saved)")
    ckpt_every_minutes: float = _f(0.0, "also save last.pt when this many minutes passed since the last save "
                                        "(0: off); SIGTERM, SIGUSR1 and Ctrl-C save and stop in any case")
    keep_every: int = _f(0, "also keep a copy checkpoints/step_XXXXXXX.pt every N steps (0: never)")
    sample_every: int = _f(0, "steps between sample grids from the EMA model (0: only at the end)")
    sample_at_end: bool = _f(True, "write a sample grid when the run ends")
    sample_classes: list | None = _f(None, "classes shown in the sample grids (default: up to 10)")
    sample_per_class: int = _f(4, "samples per class in the grids")
    sample_steps: int = _f(50, "sampler steps for the grids")
    sample_sampler: str = _f(
        "ddim", "sampler for the grids (dit_core.diffusion.SAMPLERS): ddim, ddpm or dpm-solver++; with objective "
                "flow: euler (= ddim), heun or euler-maruyama")
    sample_cfg_scale: float = _f(4.0, "classifier-free guidance scale for the grids")
    guidance_search: bool = _f(False, "after training, choose the sampling guidance for this folder: a few scales "
                                      "(and guidance over part of the path) scored by a judge fitted on the folder, "
                                      "recorded in <out>/guidance.json, which dit-sample then uses "
                                      "(dit_core.eval.guidance; class-conditional pixel folders)")
    guidance_per_class: int = _f(16, "the guidance search's samples per class and setting")
    vae: str | None = _f(None, "VAE that decodes latent samples (default: the one the latents were made "
                               "with)")
    tensorboard: bool = _f(True, "write TensorBoard logs to <out>/tb")
    progress: bool = _f(True, "show a tqdm progress bar")
    debug: bool = _f(False, "5 steps of the configured micro-batch on a small subset, to check a setup")


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def canonical(key: str) -> str:
    """The field a user's spelling of a key names (:func:`dit_core.train.spelling.canonical_key`)."""
    return canonical_key(key, field_names())


def field_types(name: str) -> tuple:
    """The types field ``name`` takes (the members of its union, or its one type)."""
    return hint_types(typing.get_type_hints(TrainConfig)[name])


def coerce(name: str, value):
    """``value`` (command-line text or a YAML value) read as the type of field ``name``."""
    return read_value(name, typing.get_type_hints(TrainConfig)[name], value)


# ----------------------------------------------------------------------------------------------------------
# Profiles and overrides
# ----------------------------------------------------------------------------------------------------------


def profiles() -> list[str]:
    """Names of the bundled profiles (``dit_core/configs/*.yaml``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def read_profile(name_or_path: str | os.PathLike) -> dict:
    """The raw settings of a bundled profile name (``digits``) or of a YAML file."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = CONFIG_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            close = difflib.get_close_matches(str(name_or_path), profiles(), n=2, cutoff=0.4)
            hint = f" Did you mean {' or '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown profile {str(name_or_path)!r}: choose one of {', '.join(profiles())}, or pass a YAML "
                f"file.{hint}"
            )
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys to values, got {type(data).__name__}")
    data.pop("profile", None)
    # A run's config.yaml also records what the run found (precision chosen, processes, classes) under
    # ``run:``; those are facts, not settings, so a run folder's config.yaml can be passed back to --config.
    data.pop("run", None)
    for key in RUN_FACTS:  # the same facts at the top level, as config.yaml files of older runs hold them
        data.pop(key, None)
    return data


#: The keys that size a model beside its name (``model``).
MODEL_SIZE_KEYS = ("depth", "hidden_size", "num_heads", "patch_size")


def make_config(profile: str | os.PathLike | None = None, overrides: dict | None = None) -> TrainConfig:
    """Defaults, then the profile, then ``overrides`` (keys in any accepted spelling). A model name in the
    overrides sets the model's size: the profile's size keys (:data:`MODEL_SIZE_KEYS`) are dropped, and only size
    keys given beside the name override it (the trainer reports them)."""
    values: dict = {}
    sources = [read_profile(profile)] if profile is not None else []
    sources.append(overrides or {})
    for source in sources:
        if "model" in {canonical(str(key)) for key in source}:
            for key in MODEL_SIZE_KEYS:
                values.pop(key, None)
        for key, value in source.items():
            name = canonical(str(key))
            values[name] = coerce(name, value)
    cfg = TrainConfig(**values)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Clear errors for values out of range and settings that cannot work together (the choices of ``Literal``
    fields are checked when the values are read, by :func:`coerce`)."""
    problems = []
    if cfg.batch_size < 1 or cfg.grad_accum < 1:
        problems.append(f"batch_size ({cfg.batch_size}) and grad_accum ({cfg.grad_accum}) must be >= 1")
    elif cfg.batch_size % cfg.grad_accum:
        problems.append(f"batch_size {cfg.batch_size} is not divisible by grad_accum {cfg.grad_accum}")
    if cfg.max_steps < 0:
        problems.append("max_steps must be >= 0")
    if not cfg.reference_steps >= 0:
        problems.append(f"reference_steps must be >= 0 (0: none), got {cfg.reference_steps}")
    if not cfg.max_minutes >= 0:  # also catches NaN
        problems.append(f"max_minutes must be >= 0 (0: no time budget), got {cfg.max_minutes}")
    if cfg.log_every < 1 or cfg.ckpt_every < 1:
        problems.append(f"log_every ({cfg.log_every}) and ckpt_every ({cfg.ckpt_every}) must be >= 1")
    if cfg.sample_every < 0 or cfg.keep_every < 0 or cfg.subset < 0:
        problems.append("sample_every, keep_every and subset must be >= 0 (0 switches them off)")
    if cfg.cpu_processes < 0:
        problems.append(f"cpu_processes must be >= 0 (0: one per usable core), got {cfg.cpu_processes}")
    if cfg.threads < 0:
        problems.append(f"threads must be >= 0 (0: torch's default), got {cfg.threads}")
    if cfg.guidance_per_class < 1:
        problems.append(f"guidance_per_class must be >= 1, got {cfg.guidance_per_class}")
    if cfg.ema_every < 1:
        problems.append(f"ema_every must be >= 1 (1: every step), got {cfg.ema_every}")
    if cfg.ckpt_every_minutes < 0:
        problems.append(f"ckpt_every_minutes must be >= 0 (0 switches it off), got {cfg.ckpt_every_minutes}")
    if not 0.0 <= cfg.ema_decay < 1.0:
        problems.append(f"ema_decay must be in [0, 1), got {cfg.ema_decay}")
    if cfg.channels not in (1, 3):
        problems.append(f"channels must be 1 (grayscale) or 3 (RGB), got {cfg.channels}")
    if len(cfg.adam_betas) != 2:
        problems.append(f"adam_betas needs two numbers, got {cfg.adam_betas}")
    if not 0.0 <= cfg.class_dropout_prob < 1.0:
        problems.append(f"class_dropout_prob must be in [0, 1), got {cfg.class_dropout_prob}")
    problems += _objective_problems(cfg)
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))


def _objective_problems(cfg: TrainConfig) -> list[str]:
    """The settings of :mod:`dit_core.train.objectives` that cannot work, each with its fix."""
    problems = []
    if cfg.objective == "flow" and cfg.learn_sigma:
        problems.append("objective flow predicts a velocity and learns no variance: add --learn-sigma false")
    from ..diffusion import sampler_objective  # here, not at import: dit-train sets OpenMP's policy before torch

    try:
        sampler_objective(cfg.sample_sampler, cfg.objective)
    except ValueError as err:
        problems.append(f"sample_sampler: {err}")
    if cfg.logit_std <= 0 or cfg.min_snr_gamma <= 0:
        problems.append(f"logit_std ({cfg.logit_std}) and min_snr_gamma ({cfg.min_snr_gamma}) must be > 0")
    if not 0.0 <= cfg.mask_ratio < 1.0:
        problems.append(f"mask_ratio must be in [0, 1), got {cfg.mask_ratio}")
    if cfg.mask_decoder_depth < 1 or cfg.mask_finetune_steps < 0 or cfg.mae_weight < 0:
        problems.append("mask_decoder_depth must be >= 1, mask_finetune_steps and mae_weight >= 0")
    if cfg.repa_weight < 0 or cfg.repa_depth < 1 or cfg.repa_projector_dim < 1:
        problems.append("repa_weight must be >= 0, repa_depth and repa_projector_dim >= 1")
    if cfg.repa_weight > 0 and cfg.depth is not None and cfg.repa_depth > cfg.depth:
        problems.append(f"repa_depth {cfg.repa_depth} aligns the tokens after block {cfg.repa_depth}, but depth is "
                        f"{cfg.depth}: add --repa-depth {max(1, cfg.depth // 2)}, or --repa-weight 0 to train without REPA")
    return problems


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


#: What a run records beside its settings (in ``config.yaml`` under ``run:``); never read back as settings.
RUN_FACTS = ("world_size", "num_classes", "classes", "sample_shape", "data_kind")


def save_yaml(cfg: TrainConfig, path: str | os.PathLike, extra: dict | None = None) -> Path:
    """Write the settings (and, under ``run:``, the facts in ``extra``) atomically; ``--config`` reads it back."""
    data = {**to_dict(cfg), **({"run": dict(extra)} if extra else {})}
    return atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))


def help_text() -> str:
    """Every key with its default and meaning, grouped as in :class:`TrainConfig`."""
    lines = []
    for f in dataclasses.fields(TrainConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"  --{f.name.replace('_', '-'):<22} {f.metadata['help']} [default: {default}]")
    aliases = ", ".join(f"--{a.replace('_', '-')} (= --{f.replace('_', '-')})" for a, f in ALIASES.items())
    return "\n".join(lines) + f"\n\nAlso accepted, the spellings of the official code and the tutorials: {aliases}"
