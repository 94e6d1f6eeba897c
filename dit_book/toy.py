"""A "perfect" noise predictor for a finite data set: the toy model of chapter 04.

If the data distribution is a finite set of points ``x_k`` (with labels ``y_k``), the best possible prediction
of the clean sample from ``x_t ~ q(x_t | x_0)`` is a posterior average (Tweedie / Bayes):

    w_k ∝ exp(-||x_t - sqrt(abar_t) x_k||^2 / (2 (1 - abar_t))),      E[x_0 | x_t] = sum_k w_k x_k,

and the matching noise prediction is ``eps = (x_t - sqrt(abar_t) E[x_0 | x_t]) / sqrt(1 - abar_t)``
(DDPM eq. 4 solved for eps). No training is involved, so a sampling loop driven by it shows what the
*samplers* do, separately from what a network learns. (It can only reproduce its points: a network that
generalises is what makes a generative model.)
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn


class ExactDenoiser(nn.Module):
    """Bayes-optimal eps-prediction for data uniformly drawn from ``points`` (``(K, C, H, W)``).

    ``alphas_cumprod`` is the schedule of the *trained* (unrespaced) process, since respaced samplers call
    the model with the original timestep indices. With ``labels`` and ``num_classes`` the denoiser is
    class-conditional: label ``y`` restricts the average to the points of class ``y``; ``y == num_classes``
    (the null class) uses all points. With ``learn_sigma`` it appends ``C`` zero channels, i.e. a variance
    halfway (in log space) between beta_tilde_t and beta_t.
    """

    def __init__(self, points, alphas_cumprod, labels=None, num_classes: int | None = None, learn_sigma=False):
        super().__init__()
        self.register_buffer("points", torch.as_tensor(points, dtype=torch.float32))
        self.register_buffer("abar", torch.as_tensor(np.asarray(alphas_cumprod), dtype=torch.float64))
        labels = torch.zeros(len(self.points), dtype=torch.long) if labels is None else torch.as_tensor(labels)
        self.register_buffer("labels", labels.long())
        self.num_classes = num_classes
        self.learn_sigma = learn_sigma

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        abar = self.abar[t].to(x.dtype).reshape(-1, 1)
        flat_x = x.flatten(1)
        flat_p = self.points.flatten(1).to(x.dtype)
        # ||x - s p||^2 = ||x||^2 - 2 s x.p + s^2 ||p||^2, with s = sqrt(abar_t) per sample
        s = abar.sqrt()
        dist = (flat_x**2).sum(1, keepdim=True) - 2 * s * flat_x @ flat_p.T + s**2 * (flat_p**2).sum(1)[None]
        logits = -dist / (2 * (1 - abar))
        if y is not None and self.num_classes is not None:
            allowed = (self.labels[None, :] == y[:, None]) | (y[:, None] == self.num_classes)
            logits = logits.masked_fill(~allowed, float("-inf"))
        x0 = logits.softmax(dim=1) @ flat_p
        eps = ((flat_x - abar.sqrt() * x0) / (1 - abar).sqrt()).reshape(x.shape)
        if self.learn_sigma:
            eps = torch.cat([eps, torch.zeros_like(eps)], dim=1)
        return eps
