"""The training configuration: one flat, plain-data record, profiles in YAML, overrides from the command line.

Every setting of a run is a field of :class:`TrainConfig` with the official DiT default (AdamW, lr 1e-4,
no weight decay, global batch 256, EMA 0.9999, label dropout 0.1, linear schedule over 1000 steps). A
*profile* (``dit_core/configs/<name>.yaml``) changes some of them for a machine or a dataset; the command line
changes any of them again. The resolved record is written to ``<out>/config.yaml`` and into every checkpoint.

Names follow this library; the spellings of the official ``train.py``, fast-DiT and the single-GPU tutorials
are accepted as aliases (:data:`ALIASES`), with hyphens and underscores alike. An unknown name is an error
that suggests the nearest known one.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..atomic import atomic_write_text

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
PRECISIONS = ("auto", "bf16", "fp16", "fp32")


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
    flip: bool = _f(True, "random horizontal flips (the paper's only augmentation); off for digits")
    class_cond: bool = _f(True, "class-conditional (classes from the dataset folders); false: unconditional")
    num_workers: int = _f(4, "DataLoader worker processes (0: load in the training process)")
    preload: str = _f("auto", "keep the whole dataset in memory: auto (small, deterministic datasets), "
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
    attn_backend: str = _f("sdpa", "attention kernel: sdpa, math, xformers")
    grad_checkpointing: bool | int = _f(False, "recompute block activations in backward: true (all "
                                               "blocks), false, or the number of blocks counted from the first")

    # -- diffusion ----------------------------------------------------------------------------------------
    diffusion_steps: int = _f(1000, "T of the forward process")
    noise_schedule: str = _f("linear", "beta schedule: linear (DiT) or squaredcos_cap_v2")

    # -- optimisation -------------------------------------------------------------------------------------
    max_steps: int = _f(400_000, "optimizer steps to train for (the run ends there)")
    batch_size: int = _f(256, "global batch: images per optimizer step, over all processes and accumulation")
    grad_accum: int = _f(1, "micro-batches accumulated per step; micro-batch = batch_size / (grad_accum x "
                            "processes)")
    lr: float = _f(1e-4, "AdamW learning rate (peak, after warmup)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_betas: list = _f([0.9, 0.999], "AdamW betas")
    lr_schedule: str = _f("constant", "constant (official) or cosine (decay to min_lr at max_steps)")
    warmup_steps: int = _f(0, "linear learning-rate warmup from 0 over this many steps")
    min_lr: float = _f(0.0, "final learning rate of the cosine schedule")
    grad_clip: float = _f(0.0, "clip the global gradient norm to this value (0: no clipping)")
    fused_adam: str = _f("auto", "fused AdamW kernel: auto (when the device supports it), true, false")
    ema_decay: float = _f(0.9999, "decay of the exponential moving average of the weights")
    ema_warmup: bool = _f(False, "ramp the EMA decay as min(decay, (1+n)/(10+n)) for short runs")
    ema_device: str = _f("same", "where the EMA weights live: same (as the model) or cpu (saves GPU memory)")
    mixed_precision: str = _f("auto", "bf16, fp16 (with a gradient scaler), fp32, or auto: bf16 on GPUs that "
                                      "have it and on CPUs with AMX/AVX512-BF16, fp16 on older GPUs, else fp32")
    tf32: bool = _f(True, "allow TF32 matmuls on Ampere and newer GPUs")
    compile: bool = _f(False, "torch.compile the model")
    seed: int = _f(0, "global seed: data order, noise, timesteps and label dropout all derive from it")
    max_bad_steps: int = _f(5, "stop with a diagnosis after this many consecutive steps skipped for "
                               "NaN/Inf")
    device: str = _f("auto", "cuda, cpu, cuda:1, mps, or auto")

    # -- output and monitoring ----------------------------------------------------------------------------
    out: str = _f("runs/dit", "run folder: config.yaml, checkpoints/, samples/, metrics.jsonl, tb/")
    resume: str | bool = _f(False, "true: continue from <out>/checkpoints/last.pt; auto: if it exists; or a "
                                   "checkpoint path")
    log_every: int = _f(100, "steps between log lines and metric records")
    ckpt_every: int = _f(5000, "steps between checkpoints (last.pt; the last step is always saved)")
    keep_every: int = _f(0, "also keep a copy checkpoints/step_XXXXXXX.pt every N steps (0: never)")
    sample_every: int = _f(0, "steps between sample grids from the EMA model (0: only at the end)")
    sample_at_end: bool = _f(True, "write a sample grid when the run ends")
    sample_classes: list | None = _f(None, "classes shown in the sample grids (default: up to 10)")
    sample_per_class: int = _f(4, "samples per class in the grids")
    sample_steps: int = _f(50, "sampler steps for the grids")
    sample_sampler: str = _f("ddim", "sampler for the grids: ddim, ddpm or dpm-solver++")
    sample_cfg_scale: float = _f(4.0, "classifier-free guidance scale for the grids")
    vae: str | None = _f(None, "VAE that decodes latent samples (default: the one the latents were made "
                               "with)")
    tensorboard: bool = _f(True, "write TensorBoard logs to <out>/tb")
    progress: bool = _f(True, "show a tqdm progress bar")
    debug: bool = _f(False, "5 steps of the configured micro-batch on a small subset, to check a setup")


# ----------------------------------------------------------------------------------------------------------
# Aliases: the spellings of the official code, fast-DiT, diffusers/accelerate tutorials
# ----------------------------------------------------------------------------------------------------------

ALIASES = {
    "data_dir": "data_path", "train_data_dir": "data_path", "dataset": "data_path",
    "feature_path": "latents_path", "features_path": "latents_path", "latent_path": "latents_path",
    "latents_dir": "latents_path",
    "resolution": "image_size",
    "global_batch_size": "batch_size", "train_batch_size": "batch_size",
    "gradient_accumulation_steps": "grad_accum", "accumulation_steps": "grad_accum", "accum": "grad_accum",
    "use_checkpoint": "grad_checkpointing", "gradient_checkpointing": "grad_checkpointing",
    "checkpointing": "grad_checkpointing",
    "learning_rate": "lr",
    "max_train_steps": "max_steps", "train_steps": "max_steps",
    "lr_warmup_steps": "warmup_steps", "lr_scheduler": "lr_schedule",
    "max_grad_norm": "grad_clip", "clip_grad": "grad_clip",
    "ema": "ema_decay",
    "precision": "mixed_precision", "amp": "mixed_precision",
    "global_seed": "seed",
    "results_dir": "out", "output_dir": "out", "outdir": "out",
    "ckpt_every_steps": "ckpt_every", "checkpointing_steps": "ckpt_every", "save_every": "ckpt_every",
    "resume_from_checkpoint": "resume",
    "cfg_scale": "sample_cfg_scale",
    "torch_compile": "compile", "use_compile": "compile",
    "allow_tf32": "tf32",
    "workers": "num_workers",
    "num_sampling_steps": "sample_steps",
    "unconditional": None,  # handled below: --unconditional means class_cond false
}

# Values of mixed_precision in other spellings (accelerate uses "no").
PRECISION_ALIASES = {"no": "fp32", "none": "fp32", "float32": "fp32", "32": "fp32", "bfloat16": "bf16",
                     "float16": "fp16", "half": "fp16", "16": "fp16"}

# Official flags with no meaning here, and what to use instead.
REPLACED = {
    "epochs": "this trainer counts optimizer steps: use --max-steps",
    "num_classes": "the class count comes from the dataset (its class folders); use --class-cond false to "
                   "train unconditionally",
}


class ConfigError(ValueError):
    """A configuration that cannot be used, with the fix in the message."""


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def canonical(key: str) -> str:
    """Map a user spelling (``--data-path``, ``gradient_accumulation_steps``) to the field name, or raise a
    :class:`ConfigError` that names the nearest known key."""
    name = key.lstrip("-").replace("-", "_").strip()
    if name in ALIASES and ALIASES[name] is not None:
        name = ALIASES[name]
    if name in field_names():
        return name
    if name in REPLACED:
        raise ConfigError(f"unknown config key {key!r}: {REPLACED[name]}")
    candidates = field_names() + [a for a, v in ALIASES.items() if v is not None]
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    if not close:  # a long key that contains a known one, e.g. "ema_decay_rate"
        close = [c for c in field_names() if c in name or name in c][:3]
    hint = f"; did you mean {' or '.join('--' + c.replace('_', '-') for c in close)}?" if close else ""
    raise ConfigError(f"unknown config key {key!r}{hint} (dit-train --help lists every key)")


# ----------------------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------------------

_TRUE = {"true", "yes", "on", "y"}
_FALSE = {"false", "no", "off", "n"}
_NONE = {"none", "null", "~", ""}


def _types(name: str) -> tuple:
    hint = typing.get_type_hints(TrainConfig)[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(typing.get_args(hint))
    return (typing.get_origin(hint) or hint,)


def coerce(name: str, value):
    """Turn ``value`` (a string from the command line, or a YAML value) into the type of field ``name``."""
    allowed = _types(name)
    text = value.strip() if isinstance(value, str) else None
    low = text.lower() if text is not None else None
    if type(None) in allowed and (value is None or low in _NONE):
        return None
    if name == "mixed_precision" and isinstance(value, (str, int)):
        value = PRECISION_ALIASES.get(str(value).lower(), str(value).lower())
        if value not in PRECISIONS:
            raise ConfigError(f"mixed_precision must be one of {', '.join(PRECISIONS)} (or 'no'), got {value!r}")
        return value
    if bool in allowed:
        if isinstance(value, bool):
            return value
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    if int in allowed and not isinstance(value, bool):
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(text.replace("_", "")) if text is not None else int(value)
        except (TypeError, ValueError):
            pass
    if float in allowed and not isinstance(value, bool):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    if list in allowed:
        if isinstance(value, (list, tuple)):
            return [_scalar(v) for v in value]
        if text is not None:
            return [_scalar(v) for v in text.strip("[]").replace(",", " ").split()]
    if str in allowed and isinstance(value, (str, int, float, os.PathLike)) and not isinstance(value, bool):
        return os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    kinds = " or ".join(sorted({t.__name__ if t is not type(None) else "none" for t in allowed}))
    raise ConfigError(f"config key {name!r} takes {kinds}, got {value!r}")


def _scalar(v):
    if isinstance(v, str):
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
    return v


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


def make_config(profile: str | os.PathLike | None = None, overrides: dict | None = None) -> TrainConfig:
    """Defaults, then the profile, then ``overrides`` (keys in any accepted spelling)."""
    values: dict = {}
    sources = [read_profile(profile)] if profile is not None else []
    sources.append(overrides or {})
    for source in sources:
        for key, value in source.items():
            if str(key).lstrip("-").replace("-", "_") == "unconditional":
                values["class_cond"] = not coerce("class_cond", value)
                continue
            name = canonical(str(key))
            values[name] = coerce(name, value)
    cfg = TrainConfig(**values)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Clear errors for settings that cannot work together."""
    problems = []
    if cfg.batch_size < 1 or cfg.grad_accum < 1:
        problems.append(f"batch_size ({cfg.batch_size}) and grad_accum ({cfg.grad_accum}) must be >= 1")
    elif cfg.batch_size % cfg.grad_accum:
        problems.append(f"batch_size {cfg.batch_size} is not divisible by grad_accum {cfg.grad_accum}")
    if cfg.max_steps < 0:
        problems.append("max_steps must be >= 0")
    if cfg.log_every < 1 or cfg.ckpt_every < 1:
        problems.append(f"log_every ({cfg.log_every}) and ckpt_every ({cfg.ckpt_every}) must be >= 1")
    if cfg.sample_every < 0 or cfg.keep_every < 0 or cfg.subset < 0:
        problems.append("sample_every, keep_every and subset must be >= 0 (0 switches them off)")
    if cfg.lr_schedule not in ("constant", "cosine"):
        problems.append(f"lr_schedule must be 'constant' or 'cosine', got {cfg.lr_schedule!r}")
    if not 0.0 <= cfg.ema_decay < 1.0:
        problems.append(f"ema_decay must be in [0, 1), got {cfg.ema_decay}")
    if cfg.ema_device not in ("same", "cpu"):
        problems.append(f"ema_device must be 'same' or 'cpu', got {cfg.ema_device!r}")
    if cfg.channels not in (1, 3):
        problems.append(f"channels must be 1 (grayscale) or 3 (RGB), got {cfg.channels}")
    if cfg.sample_sampler not in ("ddim", "ddpm", "dpm-solver++"):
        problems.append(f"sample_sampler must be 'ddim', 'ddpm' or 'dpm-solver++', got {cfg.sample_sampler!r}")
    if cfg.preload not in ("auto", "true", "false"):
        problems.append(f"preload must be auto, true or false, got {cfg.preload!r}")
    if cfg.fused_adam not in ("auto", "true", "false"):
        problems.append(f"fused_adam must be auto, true or false, got {cfg.fused_adam!r}")
    if len(cfg.adam_betas) != 2:
        problems.append(f"adam_betas needs two numbers, got {cfg.adam_betas}")
    if not 0.0 <= cfg.class_dropout_prob < 1.0:
        problems.append(f"class_dropout_prob must be in [0, 1), got {cfg.class_dropout_prob}")
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))


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
    aliases = ", ".join(f"--{a}" for a, v in sorted(ALIASES.items()) if v is not None)
    return "\n".join(lines) + f"\n\nAlso accepted (other spellings): {aliases}, --unconditional"
