"""Training checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is a plain dict, written atomically (:func:`dit_core.atomic.atomic_write`: a kill or a full disk
while saving leaves the previous ``last.pt`` intact) and readable with ``torch.load(weights_only=True)``:

=============  =======================================================================================
``model``      the trained weights (no ``module.``/``_orig_mod.`` prefixes, whatever wrapped the model)
``ema``        the EMA weights, which :func:`dit_core.load_dit` prefers
``opt``        the optimizer's state (AdamW: moments, step counts; 8-bit AdamW: byte moments, block scales)
``scaler``     the fp16 gradient scaler (its loss scale), or None
``step``       optimizer steps done
``data``       the data position: ``samples_seen`` of the stream, the seed and the dataset size
``rng``        the torch (CPU and CUDA), numpy and Python generator states of process 0 (seeded from the
               run's seed, so that they too are a function of (config, seed, step))
``ema_updates``  EMA updates done (the EMA warmup counts them)
``config``     the resolved training config, with ``model_config`` (the DiT constructor arguments)
``metrics``    the last logged loss, wall time so far
``extras``     only with the options of :mod:`dit_core.train.objectives` that add training-only parameters
               (the REPA projector, the MaskDiT mask token): their state dict
=============  =======================================================================================

The random numbers of training come from ``(seed, step)`` (:mod:`dit_core.train.batches`), so the data
position and the step are what makes a resumed run identical to an uninterrupted one; the generator states
are restored too, so that code added to the loop which draws from torch's global generator stays exact.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from ..atomic import DiskFullError, atomic_write
from ..checkpoint import CheckpointError, block_of, check_block_matches, check_state_dict, read_checkpoint
from ..models import DEFAULT_BLOCK
from .batches import derive_seed
from .config import ConfigError


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The DiT inside DistributedDataParallel (``.module``) and ``torch.compile`` (``._orig_mod``)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def rng_state() -> dict:
    """The generator states of this process, as tensors and plain data (safe for ``weights_only``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | os.PathLike, *, model, ema, opt, scaler, step: int, samples_seen: int,
                    ema_updates: int, config: dict, dataset_size: int, metrics: dict | None = None,
                    extras=None) -> Path:
    """Write a training checkpoint atomically; returns its path. ``extras``: the training-only parameters of
    an objective (a module), saved under ``extras``."""
    state = {
        "model": unwrap(model).state_dict(),
        "ema": ema.state_dict(),
        "opt": opt.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
        "step": int(step),
        "data": {"samples_seen": int(samples_seen), "seed": int(config["seed"]), "dataset_size": int(dataset_size)},
        "ema_updates": int(ema_updates),
        "rng": rng_state(),
        "config": {**config, "model_config": unwrap(model).config()},
        "metrics": dict(metrics or {}),
    }
    if extras is not None:
        state["extras"] = extras.state_dict()
    return atomic_write(path, lambda f: torch.save(state, f), size_hint=tensor_bytes(state))


class Saved:
    """When the last checkpoint was written: its step (None: none yet) and its ``time.monotonic()``."""

    def __init__(self, step: int | None, when: float | None = None):
        self.step, self.time = step, time.monotonic() if when is None else when

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
    saved.step, saved.time = ckpt["step"], time.monotonic()


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in a nested dict/list (about the size ``torch.save`` writes)."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def load_checkpoint(path: str | os.PathLike, *, model, ema, opt, scaler, dataset_size: int, seed: int,
                    restore_rng: bool = True, extras=None) -> dict:
    """Load a training checkpoint into ``model``, ``ema``, ``opt`` and ``scaler`` (in place).

    Returns the checkpoint's bookkeeping: ``step``, ``samples_seen``, ``ema_updates``, ``metrics``. A
    checkpoint of another model (size, patch, image size, classes) raises a :class:`CheckpointError` that
    names the mismatched shapes; a different dataset or seed only warns, because the run can continue but
    will not repeat the data order of an uninterrupted one.
    """
    ckpt = read_checkpoint(path)
    if not isinstance(ckpt, dict) or "model" not in ckpt or "opt" not in ckpt:
        raise CheckpointError(
            f"{path} is not a dit-train checkpoint (it has no 'model'/'opt' entries); to start from weights "
            "only, load them with dit_core.load_dit and train from there"
        )
    inner = unwrap(model)
    saved = ckpt.get("config", {}).get("model_config", {})
    check_block_matches(block_of(saved), getattr(inner, "block", DEFAULT_BLOCK), where=f"cannot resume: {path}")
    try:
        check_state_dict(inner, ckpt["model"])
    except CheckpointError as err:
        ours = inner.config()
        diffs = [f"{k}: checkpoint {saved[k]!r} vs this run {ours[k]!r}" for k in ours
                 if k in saved and saved[k] != ours[k]]
        raise CheckpointError(
            f"cannot resume from {path}: it holds another model"
            + (f" ({'; '.join(diffs)})" if diffs else "")
            + f". {err}. Resume with the settings of that run (its config.yaml), or start a new run in "
            "another --out folder."
        ) from None
    if (extras is not None) != ("extras" in ckpt):
        raise CheckpointError(
            f"cannot resume from {path}: it was trained {'with' if 'extras' in ckpt else 'without'} the training-only "
            "parameters of masking or representation alignment, this run "
            f"{'does not use them' if extras is None else 'does'}. Resume with the settings of that run (its "
            "config.yaml), or start a new run in another --out folder.")
    inner.load_state_dict(ckpt["model"])
    if extras is not None:
        extras.load_state_dict(ckpt["extras"])
    ema.load_state_dict(ckpt["ema"])
    opt.load_state_dict(ckpt["opt"])
    if scaler is not None and scaler.is_enabled():
        if ckpt.get("scaler") is not None:
            scaler.load_state_dict(ckpt["scaler"])
    data = ckpt.get("data", {})
    if data.get("dataset_size") not in (None, dataset_size) or data.get("seed") not in (None, seed):
        warnings.warn(
            f"resuming with another dataset or seed (checkpoint: {data.get('dataset_size')} images, seed "
            f"{data.get('seed')}; now: {dataset_size} images, seed {seed}); training continues, but the data "
            "order differs from an uninterrupted run",
            stacklevel=2,
        )
    if restore_rng and "rng" in ckpt:
        set_rng_state(ckpt["rng"])
    return {
        "step": int(ckpt["step"]),
        "samples_seen": int(data.get("samples_seen", ckpt["step"] * ckpt.get("config", {}).get("batch_size", 0))),
        "ema_updates": int(ckpt.get("ema_updates", ckpt["step"])),
        "metrics": ckpt.get("metrics", {}),
        "config": ckpt.get("config", {}),
    }


def seed_global_generators(seed: int, rank: int) -> None:
    """Seed torch's, numpy's and Python's global generators from the run's seed, one stream per process: the
    training draws its numbers from ``(seed, step)``, but whatever else draws from them (a library, code added
    to the loop) then starts from the same state in every run, and the checkpoint stores these states."""
    torch.manual_seed(seed + rank)
    np.random.seed(derive_seed(seed, rank, 11) % 2**32)
    random.seed(derive_seed(seed, rank, 12))


def resume_path(cfg, out: Path) -> Path | None:
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
