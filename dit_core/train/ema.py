"""The exponential moving average of the weights, which DiT samples from.

After every optimizer step, ``ema = decay * ema + (1 - decay) * weights`` (Peebles & Xie 2023, Sec. 4:
"an exponential moving average of DiT weights ... with a decay of 0.9999"; all their results use it). The
average of the last ~1 / (1 - decay) steps is smoother than any single iterate and gives clearly better
samples. With 0.9999 it averages the last ~10k steps: right for 400k-step runs, far too slow for a
few-thousand-step run on a laptop, where ``warmup`` ramps the decay up as ``min(decay, (1 + n) / (10 + n))``
after ``n`` updates, so the average never reaches further back than the run itself.
"""

from __future__ import annotations

import copy

import torch


def create_ema(model: torch.nn.Module, device: str | torch.device | None = None) -> torch.nn.Module:
    """A frozen copy of ``model`` (optionally on another device, e.g. the CPU to save GPU memory)."""
    ema = copy.deepcopy(model)
    if device is not None:
        ema = ema.to(device)
    ema.requires_grad_(False)
    return ema.eval()


def ema_decay_at(updates: int, decay: float, warmup: bool) -> float:
    """The decay used for update number ``updates`` (counting from 0)."""
    return min(decay, (1 + updates) / (10 + updates)) if warmup else decay


@torch.no_grad()
def update_ema(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    """``ema <- decay * ema + (1 - decay) * model`` for every parameter (the fixed ``pos_embed`` too; it does
    not change). One fused ``lerp`` over all tensors; with the EMA on another device (e.g. the CPU) the weights
    are copied there first, and the copy completes before the update reads it."""
    ema_params = list(ema.parameters())
    params = [p.detach() for p in model.parameters()]
    if len(ema_params) != len(params):
        raise ValueError("the EMA model and the model have different parameter lists")
    if ema_params and ema_params[0].device != params[0].device:
        params = [p.to(ema_params[0].device) for p in params]
    torch._foreach_lerp_(ema_params, params, 1.0 - decay)
