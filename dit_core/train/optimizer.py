"""The optimizer a run trains with (``optimizer``, ``lr``, ``weight_decay``, ``adam_betas``, ``fused_adam``):
AdamW as the paper trains DiT (Peebles & Xie 2023, Sec. 4: lr 1e-4, no weight decay),
bitsandbytes' 8-bit AdamW for less memory, or Muon for the blocks' matrices (:mod:`.muon`, which needs
torch 2.9 and is imported only when a run asks for it).
"""

from __future__ import annotations

import warnings

import torch

from .config import ConfigError, TrainConfig


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device,
                   precision: str = "fp32") -> torch.optim.Optimizer:
    """AdamW with the official defaults (lr 1e-4, no weight decay); the fused kernel (one pass over each
    tensor instead of one per operation: ~4x faster on the CPU, measured; it also skips a bad step on the
    device) where the device has it. ``optimizer: adamw8bit``: bitsandbytes' 8-bit AdamW (Dettmers et al.
    2022), moments stored as bytes with one scale per block of 256 values: 2 instead of 8 bytes per parameter.
    ``optimizer: muon``: PyTorch's Muon for the blocks' matrices and AdamW for the rest (:mod:`dit_core.train.muon`),
    its Newton-Schulz iteration in fp32 when the run trains in fp32 on a CPU (``precision``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "muon":
        return import_muon().make_muon(model, cfg.lr, cfg.adam_betas, cfg.weight_decay,
                         fp32=device.type == "cpu" and precision == "fp32")
    if cfg.optimizer == "adamw8bit":
        bnb = import_bitsandbytes()
        # weight_decay explicitly: bitsandbytes' default is 0.01, DiT's is 0
        return bnb.optim.AdamW8bit(params, lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=1e-8,
                                   weight_decay=cfg.weight_decay)
    fused = {"auto": device.type in ("cuda", "cpu"), "true": True, "false": False}[cfg.fused_adam]
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.adam_betas), weight_decay=cfg.weight_decay,
                             fused=fused or None)


def check_optimizer(cfg: TrainConfig) -> None:
    """A :class:`ConfigError` now, before data and model are built, if this torch lacks ``cfg.optimizer``."""
    if cfg.optimizer == "muon":
        import_muon()


def import_muon():
    """:mod:`dit_core.train.muon`, or a :class:`ConfigError` naming the torch release it needs (2.9)."""
    try:
        from . import muon
    except ImportError as err:
        raise ConfigError(str(err)) from None
    return muon


def import_bitsandbytes():
    """bitsandbytes, or a :class:`ConfigError` that says how to install it."""
    try:
        with warnings.catch_warnings():  # its import warns about torch internals it uses
            warnings.simplefilter("ignore")
            import bitsandbytes
    except ImportError:
        raise ConfigError(
            "--optimizer adamw8bit needs bitsandbytes, which is not installed: pip install -e \".[lowmem]\" "
            "(or pip install bitsandbytes); or train with --optimizer adamw"
        ) from None
    except Exception as err:  # noqa: BLE001 - a broken install (missing CUDA libraries, ...)
        raise ConfigError(f"--optimizer adamw8bit: bitsandbytes does not load here ({type(err).__name__}: "
                          f"{err}); reinstall it (pip install -e \".[lowmem]\") or use --optimizer adamw") from None
    return bitsandbytes
