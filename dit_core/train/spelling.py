"""How a user writes a setting: the other spellings of its key, and its value as text or YAML.

:class:`~dit_core.train.config.TrainConfig` says what the settings are; this module reads what people type for
them. A key is written with hyphens or underscores alike (``--data-path``, ``data_path``), or as the official
``train.py`` and the single-GPU tutorials spell it (:data:`ALIASES`); a flag that has no meaning here says what to
use instead (:data:`REPLACED`); any other unknown key is an error that names the nearest known ones. A value is
read by its field's type: ``"true"``/``"off"`` for a bool, ``"3_400"`` for an int, one of the choices of a field
typed with ``Literal``, ``"none"`` where ``None`` is allowed, ``"0.9,0.95"`` for a list.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from typing import Literal

#: The names users bring: the official ``train.py``'s flags and the single-GPU tutorials' flags and YAML keys.
ALIASES = {
    "global_batch_size": "batch_size", "results_dir": "out", "global_seed": "seed",  # official train.py
    "gradient_accumulation_steps": "grad_accum", "gradient_accumulation": "grad_accum",  # the tutorials
    "use_checkpoint": "grad_checkpointing", "base_lr": "lr", "ema_rate": "ema_decay",
}

#: Flags of the official code and the tutorials with no meaning here, and what to use instead.
REPLACED = {
    "epochs": "this trainer counts optimizer steps: use --max-steps",
    "num_classes": "the class count comes from the dataset (its class folders); use --class-cond false to "
                   "train unconditionally",
    "single_gpu": "dit-train runs one process unless torchrun starts several; drop the flag",
    "dropout": "DiT has no dropout layers; the label dropout of classifier-free guidance is --class-dropout-prob",
    "feature_path": "pre-extracted latents are --latents-path here (a dit-extract-latents folder)",
}


class ConfigError(ValueError):
    """A configuration that cannot be used, with the fix in the message."""


def canonical_key(key: str, names: list[str]) -> str:
    """Map a user spelling (``--data-path``, ``gradient_accumulation_steps``) to one of the field ``names``, or
    raise a :class:`ConfigError` that names the nearest known keys."""
    name = ALIASES.get(key.lstrip("-").replace("-", "_").strip(), key.lstrip("-").replace("-", "_").strip())
    if name in names:
        return name
    if name in REPLACED:
        raise ConfigError(f"unknown config key {key!r}: {REPLACED[name]}")
    close = difflib.get_close_matches(name, names + list(ALIASES), n=3, cutoff=0.6)
    if not close:  # a long key that contains a known one, e.g. "ema_decay_rate"
        close = [c for c in names if c in name or name in c][:3]
    hint = f"; did you mean {' or '.join('--' + c.replace('_', '-') for c in close)}?" if close else ""
    raise ConfigError(f"unknown config key {key!r}{hint} (dit-train --help lists every key)")


def hint_types(hint) -> tuple:
    """The types a field's type ``hint`` allows: the members of a union, or the one type (a ``Literal`` stays
    itself)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(typing.get_args(hint))
    return (hint,) if typing.get_origin(hint) is Literal else (typing.get_origin(hint) or hint,)


_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _scalar(v):
    """A list item: text becomes an int or a float where it reads as one; other values stay as they are."""
    if isinstance(v, str):
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
    return v


def _as(kind, value):
    """``value`` as ``kind`` (a type, or a ``Literal`` of choices); ValueError when it is not one."""
    text = value.strip() if isinstance(value, str) else None
    if typing.get_origin(kind) is Literal:
        if str(value).strip().lower() not in typing.get_args(kind):
            raise ValueError
        return str(value).strip().lower()
    if kind is bool:
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _WORDS:
            return _WORDS[text.lower()]
        raise ValueError
    if isinstance(value, bool):  # True is an int in Python, but not a number of steps
        raise ValueError
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError
        return int(text.replace("_", "")) if text is not None else int(value)
    if kind is float:
        return float(value)
    if kind is list:
        items = value if isinstance(value, (list, tuple)) else text.strip("[]").replace(",", " ").split()
        return [_scalar(v) for v in items]
    if kind is str and isinstance(value, (str, int, float, os.PathLike)):
        return os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    raise ValueError


def read_value(name: str, hint, value):
    """Turn ``value`` (a string from the command line, or a YAML value) into the type ``hint`` of field ``name``."""
    kinds = hint_types(hint)
    if type(None) in kinds and (value is None or str(value).strip().lower() in ("none", "null", "~", "")):
        return None
    for kind in kinds:
        try:
            return _as(kind, value)
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    choices = [c for k in kinds if typing.get_origin(k) is Literal for c in typing.get_args(k)]
    if choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    names = sorted({k.__name__ if k is not type(None) else "none" for k in kinds})
    raise ConfigError(f"config key {name!r} takes {' or '.join(names)}, got {value!r}")
