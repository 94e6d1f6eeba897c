"""Gaussian diffusion for DiT: schedules, the hybrid loss, DDPM and DDIM sampling, respacing.

Use it exactly like the official DiT code::

    from dit_core.diffusion import create_diffusion

    diffusion = create_diffusion(timestep_respacing="")          # training: all 1000 steps
    t = torch.randint(0, diffusion.num_timesteps, (x.shape[0],), device=x.device)
    loss = diffusion.training_losses(model, x, t, dict(y=y))["loss"].mean()

    diffusion = create_diffusion("250")                          # sampling: 250 of the 1000 steps
    samples = diffusion.p_sample_loop(model.forward_with_cfg, z.shape, z, clip_denoised=False,
                                      model_kwargs=dict(y=y, cfg_scale=4.0), progress=True)

Modules: :mod:`.schedule` (betas), :mod:`.gaussian` (the process, losses, samplers), :mod:`.respace`
(fewer steps), :mod:`.losses` (KL and discretized likelihood), :mod:`.flow` (the linear interpolant with
velocity prediction, ``objective: flow``, and its ODE/SDE samplers; :func:`create_process` picks one of the two).
"""

from .flow import LinearInterpolant
from .gaussian import GaussianDiffusion, LossType, ModelMeanType, ModelVarType
from .respace import SpacedDiffusion, space_timesteps
from .schedule import get_named_beta_schedule

__all__ = [
    "SAMPLERS",
    "sampler_objective",
    "create_diffusion",
    "create_process",
    "process_of",
    "LinearInterpolant",
    "GaussianDiffusion",
    "SpacedDiffusion",
    "space_timesteps",
    "get_named_beta_schedule",
    "LossType",
    "ModelMeanType",
    "ModelVarType",
]

#: Every sampler, the one registry the config, ``dit-sample`` and :func:`dit_core.sample.generate` read: the
#: objective whose models it samples (``ddpm``: DiT's Gaussian diffusion, :mod:`.gaussian`; ``flow``: the linear
#: interpolant, :mod:`.flow`) and its number of steps when none is given (``None``: all of the diffusion's).
#: ``ddim`` samples a flow model too, as Euler (one Euler step of the interpolant is a DDIM step).
SAMPLERS = {
    "ddpm": ("ddpm", None),
    "ddim": ("ddpm", 50),
    "dpm-solver++": ("ddpm", 25),  # Lu et al. 2022, through diffusers
    "euler": ("flow", 50),
    "heun": ("flow", 25),
    "euler-maruyama": ("flow", 250),
}


def sampler_objective(sampler: str, objective: str) -> str:
    """``sampler`` checked against the model's ``objective`` (a clear error for a mismatch); returns the name
    the sampler goes by for that objective (``ddim`` of a flow model is ``euler``)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}: choose one of {', '.join(SAMPLERS)}")
    if objective == "flow" and sampler == "ddim":
        return "euler"
    if SAMPLERS[sampler][0] != objective:
        fits = [name for name, (kind, _) in SAMPLERS.items()
                if kind == objective or (objective == "flow" and name == "ddim")]
        raise ValueError(f"sampler {sampler!r} does not sample a model trained with objective {objective!r}: use one "
                         f"of {', '.join(fits)}")
    return sampler


def create_diffusion(
    timestep_respacing,
    noise_schedule="linear",
    use_kl=False,
    sigma_small=False,
    predict_xstart=False,
    learn_sigma=True,
    rescale_learned_sigmas=False,
    diffusion_steps=1000,
):
    """Build the diffusion DiT uses; the signature and defaults are those of the official ``create_diffusion``.

    :param timestep_respacing: ``""`` or ``None`` for all ``diffusion_steps`` steps (training), ``"250"``
        for 250 evenly spaced steps, ``"ddim25"`` for a DDIM stride, ``"10,20"`` for per-section counts
        (see :func:`space_timesteps`).
    :param noise_schedule: ``"linear"`` (DiT) or ``"squaredcos_cap_v2"`` (cosine).
    :param use_kl: train on the variational bound alone (``LossType.RESCALED_KL``).
    :param sigma_small: with a fixed variance, use beta_tilde_t instead of beta_t.
    :param predict_xstart: the model predicts x_0 instead of the noise.
    :param learn_sigma: the model outputs 2C channels, the second half choosing the variance (DiT).
    :param rescale_learned_sigmas: ``LossType.RESCALED_MSE``: scale the vb term by T / 1000.
    :param diffusion_steps: T of the trained process.
    """
    betas = get_named_beta_schedule(noise_schedule, diffusion_steps)
    if use_kl:
        loss_type = LossType.RESCALED_KL
    elif rescale_learned_sigmas:
        loss_type = LossType.RESCALED_MSE
    else:
        loss_type = LossType.MSE
    if timestep_respacing is None or timestep_respacing == "":
        timestep_respacing = [diffusion_steps]
    if learn_sigma:
        model_var_type = ModelVarType.LEARNED_RANGE
    else:
        model_var_type = ModelVarType.FIXED_SMALL if sigma_small else ModelVarType.FIXED_LARGE
    return SpacedDiffusion(
        use_timesteps=space_timesteps(diffusion_steps, timestep_respacing),
        betas=betas,
        model_mean_type=ModelMeanType.START_X if predict_xstart else ModelMeanType.EPSILON,
        model_var_type=model_var_type,
        loss_type=loss_type,
    )


def create_process(objective="ddpm", noise_schedule="linear", learn_sigma=True, diffusion_steps=1000):
    """The process a model was trained with, for training and sampling it: DiT's Gaussian diffusion over all
    ``diffusion_steps`` (``objective="ddpm"``, :func:`create_diffusion`) or the linear interpolant
    (``objective="flow"``, :class:`~dit_core.diffusion.flow.LinearInterpolant`; it has no schedule and no
    learned variance)."""
    if objective == "flow":
        if learn_sigma:
            raise ValueError("objective 'flow' predicts a velocity only: build the model with learn_sigma=False")
        return LinearInterpolant()
    if objective != "ddpm":
        raise ValueError(f"objective must be 'ddpm' or 'flow', got {objective!r}")
    return create_diffusion("", noise_schedule=noise_schedule, learn_sigma=learn_sigma,
                            diffusion_steps=diffusion_steps)


def process_of(info: dict, learn_sigma: bool):
    """:func:`create_process` for a trained model, from its run's config or :func:`dit_core.sample.load_model`'s
    ``info`` (the keys ``objective``, ``noise_schedule`` and ``diffusion_steps``; DiT's defaults where one is
    missing)."""
    return create_process(info.get("objective", "ddpm"), noise_schedule=info.get("noise_schedule", "linear"),
                          learn_sigma=learn_sigma, diffusion_steps=info.get("diffusion_steps", 1000))
