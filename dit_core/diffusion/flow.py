"""The linear interpolant with velocity prediction (SiT, Ma et al. 2024), and the ODE/SDE samplers that go with it.

**Convention** (the SiT paper's and REPA's; this module uses it everywhere): time runs from data to noise,

    x_t = (1 - t) x_0 + t eps,    t in [0, 1],    x_0 the data, eps ~ N(0, I),

and the network predicts the velocity of that straight path, ``v = dx_t/dt = eps - x_0``. The official SiT code
runs time the other way (t = 0 noise, t = 1 data, target data - noise): the same model up to ``t -> 1 - t`` and
``v -> -v``. The DiT is given ``1000 t`` as its timestep, so its sinusoidal timestep embedding spans the range it
spans for DiT's 1000 diffusion steps, noisier inputs at larger timesteps as with DDPM.

From one velocity prediction both ends of the path follow: ``x_0 = x_t - t v`` and ``eps = x_t + (1 - t) v``.

**Sampling** integrates the probability-flow ODE ``dx/dt = v(x, t)`` from ``t = 1`` (pure noise) down to ``t = 0``
on ``steps`` equal intervals:

* ``euler``: ``x_{t-h} = x_t - h v(x_t, t)``. For this path one Euler step *is* one deterministic DDIM step of the
  same model (predict ``x_0`` and ``eps`` as above, re-noise to ``s = t - h``: ``(1-s) x_0 + s eps = x_t - h v``),
  so ``ddim`` is accepted as its name;
* ``heun``: Euler, then the trapezoidal correction ``x_{t-h} = x_t - h (v(x_t, t) + v(x_pred, t-h)) / 2``
  (second order; the last interval, which ends at ``t = 0``, is an Euler step): ``2 steps - 1`` model calls;
* ``euler-maruyama``: the reverse-time SDE with the same marginals, ``dx = [v - g^2 s / 2] dt + g dW`` run
  backwards, with the score ``s = -eps/t`` and the diffusion coefficient ``g(t)^2 = t`` (our choice: noise
  injected in proportion to the noise level, vanishing at the data end). One step reads
  ``x_{t-h} = x_t - h (v + eps/2) + sqrt(t h) z``; the last interval is the deterministic step to
  ``x_0 = x_t - t v``, so the sample carries no fresh noise. SiT's SDE sampler is the same idea with its own
  choices of ``g`` (SiT's default is a form it calls "sigma") and a last step of 0.04;
"""

from __future__ import annotations

import torch

from .losses import mean_flat

#: The samplers of the linear interpolant (:data:`dit_core.diffusion.SAMPLERS` gives their default steps, and
#: maps ``ddim`` of a flow model to ``euler``).
FLOW_SAMPLERS = ("euler", "heun", "euler-maruyama")


def _bcast(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, *([1] * (like.dim() - 1))).to(like.dtype)


class LinearInterpolant:
    """The path ``x_t = (1 - t) x_0 + t eps`` and its velocity ``eps - x_0`` (t in [0, 1], 0 = data).

    It stands where a :class:`~dit_core.diffusion.GaussianDiffusion` stands: the trainer builds it for
    ``objective: flow`` (:func:`dit_core.diffusion.create_process`), :func:`dit_core.sample.generate` samples
    with it, and :meth:`training_losses` has the Gaussian diffusion's interface. ``num_timesteps`` (1000) is the
    scale of the model's timestep input, ``1000 t``.
    """

    is_interpolant = True
    num_timesteps = 1000

    def loss_map(self, x_start: torch.Tensor, noise: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The squared velocity error of each element (shape of ``x_start``)."""
        return (self.velocity_target(x_start, noise) - out) ** 2

    def model_time(self, t: torch.Tensor) -> torch.Tensor:
        """The timestep the DiT sees for time ``t``: ``1000 t``."""
        return t * self.num_timesteps

    def path(self, x_start: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``x_t = (1 - t) x_0 + t eps`` (``t`` of shape (N,))."""
        tt = _bcast(t, x_start)
        return (1 - tt) * x_start + tt * noise

    @staticmethod
    def velocity_target(x_start: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """What the network learns to predict: ``dx_t/dt = eps - x_0``."""
        return noise - x_start

    @staticmethod
    def snr(t: torch.Tensor) -> torch.Tensor:
        """Signal-to-noise ratio of ``x_t``: ``((1 - t) / t)^2`` (infinite at the data end)."""
        return ((1 - t) / t) ** 2

    def training_losses(self, model, x_start, t, model_kwargs=None, noise=None, reduce=mean_flat):
        """Per-example velocity MSE at continuous times ``t`` (N,) in [0, 1]: ``{"loss", "mse"}``, each (N,).
        ``reduce`` turns the elementwise squared error into one number per example (default: the mean)."""
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.path(x_start, noise, t)
        out = model(x_t, self.model_time(t), **(model_kwargs or {}))
        mse = reduce(self.loss_map(x_start, noise, out))
        return {"loss": mse, "mse": mse}


def time_grid(steps: int) -> list[float]:
    """``steps + 1`` equally spaced times from 1 (noise) to 0 (data)."""
    steps = int(steps)
    if steps < 1:
        raise ValueError(f"a flow sampler needs at least 1 step, got {steps}")
    return [1.0 - i / steps for i in range(steps + 1)]


def sample_flow(velocity, x: torch.Tensor, *, sampler: str = "euler", steps: int = 50, noise=None,
                callback=None, tick=None) -> torch.Tensor:
    """Integrate from the noise ``x`` (t = 1) to a sample (t = 0) with ``sampler`` in ``steps`` intervals.

    ``velocity(x, t)``: the model's velocity for a batch at time ``t`` (a float tensor (N,) in [0, 1]);
    ``noise(shape)``: a batch of standard normal draws of one sample's ``shape`` for the SDE's steps
    (default ``torch.randn``); ``callback(info)``
    after every interval with ``step``, ``num_steps``, ``t`` (the time reached), ``x`` and ``x0`` (the predicted
    sample); ``tick()`` after every interval (a progress bar).
    """
    if sampler not in FLOW_SAMPLERS:
        raise ValueError(f"sampler {sampler!r} is not a sampler of the linear interpolant: use one of "
                         f"{', '.join(FLOW_SAMPLERS)}")
    grid = time_grid(steps)
    n = len(grid) - 1
    if noise is None:
        noise = lambda shape: torch.randn((len(x), *shape), device=x.device)  # noqa: E731
    for k in range(n):
        t, s = grid[k], grid[k + 1]
        h = t - s
        tt = torch.full((len(x),), t, device=x.device)
        v = velocity(x, tt)
        x0 = x - t * v
        if sampler == "euler" or (sampler == "heun" and k == n - 1):
            x = x - h * v
        elif sampler == "heun":
            x_pred = x - h * v
            v2 = velocity(x_pred, torch.full((len(x),), s, device=x.device))
            x = x - h * 0.5 * (v + v2)
        elif k == n - 1:  # euler-maruyama: the last interval is the deterministic step to x_0
            x = x0
        else:
            eps = x + (1 - t) * v
            x = x - h * (v + 0.5 * eps) + (t * h) ** 0.5 * noise(x.shape[1:])
        if tick is not None:
            tick()
        if callback is not None:
            callback(dict(step=k, num_steps=n, t=s, x=x, x0=x0))
    return x
