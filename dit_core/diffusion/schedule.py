"""Noise schedules: the variances beta_1..beta_T of the forward process.

The forward (noising) process of Ho et al. 2020, eq. (2), adds Gaussian noise of variance beta_t at
step t. A schedule is just that array of betas, kept in float64 because products of a thousand
numbers close to one lose precision quickly in float32.

Two schedules are offered, by the names the official DiT and improved-diffusion code use:

* ``"linear"`` -- Ho et al. 2020, Sec. 4: betas rise linearly from 1e-4 to 0.02 over T = 1000 steps.
  For other T the end points are scaled by 1000 / T so that the total amount of noise stays about the
  same (Nichol & Dhariwal 2021, Sec. 3.2 / their code). DiT uses this schedule.
* ``"squaredcos_cap_v2"`` (alias ``"cosine"``) -- Nichol & Dhariwal 2021, eq. (17): choose
  alpha_bar(t) = cos(((t/T + s) / (1 + s)) * pi/2)^2 with s = 0.008 and derive
  beta_t = 1 - alpha_bar(t) / alpha_bar(t-1), capped at 0.999 so that the last steps stay finite.
"""

import math

import numpy as np

SCHEDULES = ("linear", "squaredcos_cap_v2")
_ALIASES = {"cosine": "squaredcos_cap_v2"}


def linear_betas(num_diffusion_timesteps):
    """Ho et al. 2020: betas linear from 1e-4 to 0.02 for T = 1000, end points scaled by 1000 / T."""
    scale = 1000 / num_diffusion_timesteps
    return np.linspace(scale * 0.0001, scale * 0.02, num_diffusion_timesteps, dtype=np.float64)


def betas_for_alpha_bar(num_diffusion_timesteps, alpha_bar, max_beta=0.999):
    """Betas that make the cumulative product of (1 - beta) follow ``alpha_bar``.

    ``alpha_bar`` maps t in [0, 1] to the fraction of signal variance left at time t (alpha_bar(0) = 1).
    Step i covers [i / T, (i + 1) / T] and removes the factor alpha_bar(t2) / alpha_bar(t1), so
    beta_i = 1 - alpha_bar(t2) / alpha_bar(t1) (Nichol & Dhariwal 2021, Sec. 3.2), capped at ``max_beta``.
    """
    betas = []
    for i in range(num_diffusion_timesteps):
        t1 = i / num_diffusion_timesteps
        t2 = (i + 1) / num_diffusion_timesteps
        betas.append(min(1 - alpha_bar(t2) / alpha_bar(t1), max_beta))
    return np.array(betas, dtype=np.float64)


def cosine_alpha_bar(t, s=0.008):
    """Nichol & Dhariwal 2021, eq. (17), with t already divided by T (so t is in [0, 1])."""
    return math.cos((t + s) / (1 + s) * math.pi / 2) ** 2


def get_named_beta_schedule(schedule_name, num_diffusion_timesteps):
    """Return the float64 betas of a schedule called ``schedule_name`` with ``num_diffusion_timesteps`` steps.

    Names: ``"linear"`` (DiT's default) and ``"squaredcos_cap_v2"`` (the cosine schedule; ``"cosine"``
    is accepted as an alias).
    """
    if isinstance(num_diffusion_timesteps, bool) or not isinstance(num_diffusion_timesteps, (int, np.integer)):
        raise ValueError(
            f"diffusion_steps must be a positive integer, got {num_diffusion_timesteps!r}; "
            "DiT uses diffusion_steps=1000."
        )
    if num_diffusion_timesteps < 1:
        raise ValueError(f"diffusion_steps must be at least 1, got {num_diffusion_timesteps}.")
    name = _ALIASES.get(schedule_name, schedule_name)
    if name == "linear":
        if num_diffusion_timesteps < 21:
            raise ValueError(
                f"the linear schedule needs diffusion_steps >= 21 (its last beta, 0.02 * 1000 / T, must stay "
                f"below 1), got {num_diffusion_timesteps}; use more steps or noise_schedule='squaredcos_cap_v2'."
            )
        return linear_betas(num_diffusion_timesteps)
    if name == "squaredcos_cap_v2":
        return betas_for_alpha_bar(num_diffusion_timesteps, cosine_alpha_bar)
    raise ValueError(
        f"unknown noise_schedule {schedule_name!r}; choose one of {', '.join(SCHEDULES)} "
        "(DiT uses 'linear')."
    )
