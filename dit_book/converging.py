"""The helpers of chapter "Converging faster": a toy whose velocity is known exactly, the curves of the timestep
densities and loss weights, a picture of masked tokens, and the live timing of a step per option.

The measurements themselves (runs, records, table, curves) are :mod:`dit_book.convergence`.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch


class ExactVelocity:
    """The exact velocity ``E[eps - x_0 | x_t]`` of the linear interpolant when the data are the finite set
    ``points`` (N, D): the posterior over the points is a softmax of ``-|x_t - (1-t) x_i|^2 / (2 t^2)``. What a
    perfectly trained flow model predicts; its ODE carries noise to one of the points."""

    def __init__(self, points: torch.Tensor):
        self.points = points.reshape(len(points), -1).float()

    def __call__(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(len(x), -1)
        tt = t.reshape(-1, 1).clamp(min=1e-4)
        d2 = ((flat[:, None, :] - (1 - tt)[:, :, None] * self.points[None]) ** 2).sum(-1)
        w = torch.softmax(-d2 / (2 * tt**2), dim=1)  # (N, P) posterior over the points
        x0 = w @ self.points
        eps = (flat - (1 - tt) * x0) / tt
        return (eps - x0).reshape(x.shape)


def ddpm_signal_noise(diffusion) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(t, sqrt(alpha_bar_t), sqrt(1 - alpha_bar_t))`` of a Gaussian diffusion with ``t = step / T``."""
    abar = np.asarray(diffusion.alphas_cumprod)
    return np.arange(len(abar)) / len(abar), np.sqrt(abar), np.sqrt(1 - abar)


def logit_normal_density(t: np.ndarray, mean: float = 0.0, std: float = 1.0) -> np.ndarray:
    """The density of ``sigmoid(n)``, ``n ~ N(mean, std)``: ``exp(-(logit t - m)^2 / 2 s^2) / (s sqrt(2 pi) t (1 - t))``."""
    logit = np.log(t / (1 - t))
    return np.exp(-((logit - mean) ** 2) / (2 * std**2)) / (std * math.sqrt(2 * math.pi) * t * (1 - t))


def masked_picture(image: torch.Tensor, keep: torch.Tensor, patch_size: int, fill: float = 0.0) -> torch.Tensor:
    """``image`` (C, H, W) with every patch not in ``keep`` (token indices, row-major) set to ``fill``: what the
    encoder of masked training sees."""
    c, h, w = image.shape
    g = w // patch_size
    out = torch.full_like(image, fill)
    for k in keep.tolist():
        r, q = divmod(int(k), g)
        sl = (slice(None), slice(r * patch_size, (r + 1) * patch_size), slice(q * patch_size, (q + 1) * patch_size))
        out[sl] = image[sl]
    return out


def time_steps(step, micro_batches, n: int = 10, warmup: int = 2) -> float:
    """Seconds per training step of ``step`` (a :class:`~dit_core.train.step.TrainStep`), the median of ``n``
    steps after ``warmup``; ``micro_batches`` is an endless iterator of ``(x, y)``."""
    times = []
    for k in range(warmup + n):
        t0 = time.perf_counter()
        step(k, micro_batches)
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))
