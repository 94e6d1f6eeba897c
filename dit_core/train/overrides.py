"""What the command line changed in a profile (``dit-train --config digits --model DiT-S/2 --lr 1e-3``).

A profile's settings are tuned together: its learning rate, batch and length fit its model. Every ``--key value``
replaces one of them, and a model name replaces the profile's model size as a whole: the profile's ``depth``,
``hidden_size``, ``num_heads`` and ``patch_size`` are dropped and the named configuration's own size is trained
(:func:`dit_core.train.config.make_config`). So ``--config digits --model DiT-S/2`` trains DiT-S/2 at its full
size, about 33 M parameters, with settings tuned for the profile's 1.3 M.

:func:`find_overrides` lists every key the command line changed, old -> new; :meth:`Overrides.lines` says them,
with a plain warning when the model's size changed. ``dit-train`` prints them before the run starts; the trainer
adds both models' parameter counts (:func:`dit_core.train.loop.report_overrides`) and records all of it in
``<out>/config.yaml`` under ``run: overrides`` (not in the checkpoints: they stay a function of the settings,
the seed and the step, whatever command line resumed them). This module imports no torch (``dit-train`` sets OpenMP's thread
policy before torch starts).
"""

from __future__ import annotations

import dataclasses
import os

from .config import MODEL_SIZE_KEYS, TrainConfig, canonical, coerce, read_profile, to_dict

#: The settings a profile tunes for its model: when the model's size changes, these may no longer fit.
TUNED = ("lr", "batch_size", "grad_accum", "max_steps", "max_minutes", "warmup_steps", "lr_schedule", "min_lr",
         "ema_decay", "grad_clip", "mixed_precision", "grad_checkpointing", "reference_steps")


@dataclasses.dataclass
class Change:
    """One setting the command line changed: ``old`` from the profile (``was``: "profile") or the defaults
    ("default"), ``new`` as the run has it, ``by`` the flag that changed it (a size key dropped by ``--model``
    has ``new`` None: the model's own size)."""

    key: str
    old: object
    new: object
    was: str
    by: str


@dataclasses.dataclass
class Overrides:
    """The command line's changes to a profile, and the profile's model when they changed its size."""

    profile: str | None
    changes: list[Change]
    #: the model and size keys the profile trains (``model``, ``depth``, ...) when the command line resized the
    #: model, else None
    tuned_model: dict | None = None
    #: the profile's tuned settings the command line left as they were
    kept_tuned: dict = dataclasses.field(default_factory=dict)

    def lines(self, cfg: TrainConfig) -> list[str]:
        """What ``dit-train`` prints: one line per change, and the warning when the model's size changed."""
        if not self.changes:
            return []
        out = [f"dit-train: the command line changed {len(self.changes)} setting(s) of profile {self.profile}:"]
        for c in self.changes:
            new = c.new if c.new is not None else f"{_model_value(cfg.model, c.key)} ({cfg.model}'s own)"
            out.append(f"  {c.key}: {c.old}{' (default)' if c.was == 'default' else ''} -> {new} ({c.by})")
        if self.tuned_model is not None:
            kept = ", ".join(f"{k} {v}" for k, v in self.kept_tuned.items())
            by_name = any(c.by == "--model" for c in self.changes)
            out.append(f"dit-train: the profile's model is {describe_model(self.tuned_model)}; this run trains "
                       f"{describe_model(_size(to_dict(cfg)))}. The profile's other settings"
                       + (f" ({kept})" if kept else "") + " were tuned for the profile's model, not for this one: "
                       "set them for this model too" + (" (or keep the profile's size: drop --model)" if by_name
                                                         else "") + ".")
        return out

    def record(self) -> dict:
        """Plain data for ``config.yaml`` (``run: overrides``)."""
        return {"profile": self.profile,
                "changed": {c.key: {"from": c.old, "to": c.new, "by": c.by} for c in self.changes},
                **({"tuned_for": self.tuned_model} if self.tuned_model is not None else {})}


def find_overrides(profile: str | os.PathLike | None, overrides: dict, cfg: TrainConfig) -> Overrides:
    """What ``overrides`` (command-line keys, any spelling) changed in ``profile``, given the resolved ``cfg``
    (:func:`dit_core.train.config.make_config` of both). Without a profile the command line is the whole
    configuration: nothing to report."""
    if profile is None:
        return Overrides(None, [])
    given = {}
    for key, value in read_profile(profile).items():
        name = canonical(str(key))
        given[name] = coerce(name, value)
    before, after = to_dict(TrainConfig(**given)), to_dict(cfg)
    named = {canonical(str(key)) for key in overrides}
    changes = []
    for key, new in after.items():
        if before[key] == new:
            continue
        by = "--model" if key in MODEL_SIZE_KEYS and key not in named else f"--{key.replace('_', '-')}"
        changes.append(Change(key, before[key], new, "profile" if key in given else "default", by))
    resized = ("model" in given or any(k in given for k in MODEL_SIZE_KEYS)) \
        and _size(before) != _size(after)
    return Overrides(str(profile), changes,
                     tuned_model=_size(before) if resized else None,
                     kept_tuned={k: given[k] for k in TUNED if k in given and k not in named} if resized else {})


def _size(values: dict) -> dict:
    """The model name and the size keys set beside it."""
    return {"model": values["model"], **{k: values[k] for k in MODEL_SIZE_KEYS if values[k] is not None}}


def _model_value(model: str, key: str):
    from ..models import model_kwargs  # imports torch: only once dit-train has set up the process

    try:
        return model_kwargs(model)[key]
    except ValueError:
        return "?"


def describe_model(size: dict) -> str:
    """``DiT-S/2 with depth 4, hidden_size 128, num_heads 4`` (or the bare name)."""
    extra = ", ".join(f"{k} {v}" for k, v in size.items() if k != "model")
    return size["model"] + (f" with {extra}" if extra else "")
