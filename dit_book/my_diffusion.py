"""The reader's diffusion code, as the book's solutions write it: what chapters 4, 5 and 7 ask the reader to write.

* chapter 4: :func:`q_sample` (the forward process in one jump, DDPM eq. 4), :func:`simple_loss` (``L_simple``,
  DDPM eq. 14) and :func:`ddim_step` (one deterministic DDIM step, Song et al. 2021 eq. 12 with eta = 0);
* chapter 5: :func:`training_step`, DiT's training step with the hybrid loss of Improved DDPM (``L_simple`` plus
  the variational bound on a detached mean), which trains the reader's DiT; :func:`simple_step`, the step of a DiT
  with a fixed variance and ``L_simple`` alone; :func:`newton_schulz`, Muon's orthogonalisation;
* chapter 7: :func:`guided_fn`, classifier-free guidance as a sampler's ``model_fn``.

Each exercise's checker (:mod:`dit_book.exercises`) compares the reader's version with ``dit_core``. The folded
solution cells of the chapters hold exactly this code (``tests/test_my_dit.py``). :mod:`dit_book.reader` assembles
the reader's code: their version of a part where they wrote one that passes its check, this one where they did not,
all in one namespace, so that :func:`training_step` and :func:`simple_step` call the reader's own :func:`q_sample`
and :func:`simple_loss` when there are. The real code stays in :mod:`dit_core.diffusion`, :mod:`dit_core.train`
and :mod:`dit_core.sample`; nothing in ``dit_core`` uses this module.
"""

from __future__ import annotations

import math

import torch

from dit_core.diffusion.losses import discretized_gaussian_log_likelihood, mean_flat, normal_kl

__all__ = ["ddim_step", "guided_fn", "newton_schulz", "q_sample", "simple_loss", "simple_step", "training_step"]


# Chapter 4, exercise 5: the forward process
def q_sample(x0, t, noise, alpha_bar):
    a = alpha_bar[t].reshape(-1, 1, 1, 1)             # one alpha_bar per image, over all its pixels
    return (a.sqrt() * x0 + (1 - a).sqrt() * noise).to(x0.dtype)


# Chapter 4, exercise 6: L_simple
def simple_loss(model, x0, y, t, noise, alpha_bar):
    eps = model(q_sample(x0, t, noise, alpha_bar), t, y)[:, : x0.shape[1]]   # the noise channels
    return ((noise - eps) ** 2).mean()


# Chapter 4, exercise 4: one DDIM step
def ddim_step(x_t, eps, alpha_bar_t, alpha_bar_prev):
    x0_hat = (x_t - math.sqrt(1 - alpha_bar_t) * eps) / math.sqrt(alpha_bar_t)
    return math.sqrt(alpha_bar_prev) * x0_hat + math.sqrt(1 - alpha_bar_prev) * eps


# Chapter 5, section 5.2: the training step with the hybrid loss
def training_step(model, ema, opt, diffusion, x0, y, g, ema_decay, label_dropout=0.1):
    t = torch.randint(0, diffusion.num_timesteps, (len(x0),), generator=g)    # a step for every image,
    noise = torch.randn(x0.shape, generator=g)                                  # its noise,
    drop = torch.rand(len(x0), generator=g) < label_dropout                     # and whether its label goes
    y = torch.where(drop, torch.full_like(y, model.num_classes), y)             # label dropout: the null class
    alpha_bar = torch.as_tensor(diffusion.schedule["alpha_bar"])
    x_t = q_sample(x0, t, noise, alpha_bar)                                     # chapter 4: x_0 -> x_t in one jump
    eps, v = model(x_t, t, y).chunk(2, dim=1)                                   # predicted noise, variance values
    mse = mean_flat((noise - eps) ** 2)                                         # L_simple, per image
    frozen = torch.cat([eps.detach(), v], dim=1)                                # L_vlb may not move the mean
    p = diffusion.p_mean_variance(lambda *_: frozen, x_t, t, clip_denoised=False)  # p(x_{t-1} | x_t)
    mean, _, log_var = diffusion.q_posterior_mean_variance(x0, x_t, t)           # q(x_{t-1} | x_t, x_0)
    kl = mean_flat(normal_kl(mean, log_var, p["mean"], p["log_variance"]))      # L_{t-1}, t > 0
    nll = -mean_flat(discretized_gaussian_log_likelihood(x0, means=p["mean"], log_scales=p["log_variance"] / 2))
    loss = (mse + torch.where(t == 0, nll, kl) / math.log(2)).mean()            # L_simple + L_vlb (bits)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()                                                                  # AdamW
    with torch.no_grad():
        for e, w in zip(ema.parameters(), model.parameters()):
            e.lerp_(w, 1 - ema_decay)                                           # EMA: e += (1 - decay) (w - e)
    return loss.detach()


# Chapter 5, exercise 5: the training step of a fixed-variance DiT, with chapter 4's L_simple
def simple_step(model, ema, opt, diffusion, x0, y, g, ema_decay, label_dropout=0.1):
    t = torch.randint(0, diffusion.num_timesteps, (len(x0),), generator=g)
    noise = torch.randn(x0.shape, generator=g)
    drop = torch.rand(len(x0), generator=g) < label_dropout
    y = torch.where(drop, torch.full_like(y, model.num_classes), y)
    loss = simple_loss(model, x0, y, t, noise, torch.as_tensor(diffusion.schedule["alpha_bar"]))   # chapter 4
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    with torch.no_grad():
        for e, w in zip(ema.parameters(), model.parameters()):
            e.lerp_(w, 1 - ema_decay)
    return loss.detach()


# Chapter 5, exercise 4: Muon's Newton-Schulz iteration
def newton_schulz(g, steps=5, a=3.4445, b=-4.7750, c=2.0315):
    x = g / g.norm()                     # singular values now at most 1
    for _ in range(steps):
        A = x @ x.T                      # m x m for an m x n matrix
        x = a * x + (b * A + c * A @ A) @ x
    return x


# Chapter 7, section 7.7: classifier-free guidance from two passes
def guided_fn(model, cfg_scale):
    def model_fn(x, t, y):
        cond = model(x, t, y)
        uncond = model(x, t, torch.full_like(y, model.num_classes))              # the null class
        c = model.in_channels
        eps = uncond[:, :c] + cfg_scale * (cond[:, :c] - uncond[:, :c])
        return torch.cat([eps, cond[:, c:]], dim=1)                             # variance channels: unguided
    return model_fn
