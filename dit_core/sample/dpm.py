"""DPM-Solver++ (Lu et al. 2022): DiT's diffusion sampled in 20-25 steps, through diffusers' scheduler.

The solver treats sampling as an ODE in the noise prediction and takes second-order multistep steps on it; it
needs only the betas of the trained diffusion and the model's noise prediction (the learned variance is not
used). ``dit_core`` does not re-implement it: :func:`dpm_solver_scheduler` configures diffusers'
``DPMSolverMultistepScheduler`` on this diffusion's betas, and :func:`run_dpm` drives it with the model, as
:func:`dit_core.sample.generate` does for ``sampler="dpm-solver++"``.
"""

import numpy as np
import torch

from ..diffusion.respace import training_steps
from ..runtime import autocast


def dpm_solver_scheduler(diffusion, steps: int, clip_denoised: bool):
    """diffusers' DPM-Solver++ (2nd order, multistep) on this diffusion's betas; ``clip_denoised`` clips the
    predicted x_0 to [-1, 1] (its thresholding with a maximum of 1 is exactly that)."""
    from diffusers import DPMSolverMultistepScheduler

    scheduler = DPMSolverMultistepScheduler(
        num_train_timesteps=training_steps(diffusion), trained_betas=np.asarray(diffusion.betas, np.float64),
        algorithm_type="dpmsolver++", solver_order=2, prediction_type="epsilon", lower_order_final=True,
        timestep_spacing="linspace", thresholding=bool(clip_denoised), sample_max_value=1.0,
    )
    scheduler.set_timesteps(int(steps))
    return scheduler


def run_dpm(diffusion, model_fn, x, y, *, steps: int, clip_denoised: bool, amp, device, tick, callback):
    """One batch from its noise ``x`` to x_0 with :func:`dpm_solver_scheduler`, the model's noise prediction
    (its first C channels) under autocast; ``callback`` gets no predicted x_0 (``x0`` None)."""
    if diffusion.num_timesteps != training_steps(diffusion):
        raise ValueError("pass the training diffusion (create_diffusion('')) to the dpm-solver++ sampler")
    scheduler = dpm_solver_scheduler(diffusion, steps, clip_denoised)
    channels = x.shape[1]
    for k, t in enumerate(scheduler.timesteps):
        tt = torch.full((len(x),), int(t), dtype=torch.long, device=device)
        with autocast(device, amp):
            eps = model_fn(x, tt, y)[:, :channels].float()
        x = scheduler.step(eps, t, x).prev_sample
        tick()
        if callback is not None:
            callback(dict(step=k, num_steps=len(scheduler.timesteps), t=int(t), x=x, x0=None))
    return x
