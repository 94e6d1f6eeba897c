"""Generating images from a DiT: classifier-free guidance, three samplers, pixels or VAE latents, reproducibly.

:func:`generate` runs the reverse diffusion for a list of class labels:

* **samplers.** A model trained with ``objective: flow`` (the linear interpolant; its ``diffusion`` is a
  :class:`~dit_core.diffusion.flow.LinearInterpolant`) is sampled by the ODE/SDE samplers of
  :mod:`dit_core.diffusion.flow` (``"euler"``, which ``"ddim"`` names too, ``"heun"``, ``"euler-maruyama"``),
  never by the DDPM loop. For DiT's diffusion: ``"ddpm"``: ancestral sampling with DiT's learned variance (DDPM Alg. 2, Improved DDPM eq. 15)
  on ``steps`` evenly spaced steps of the 1000 (the paper evaluates with 250). ``"ddim"``: Song et al. 2021,
  eq. 12, any ``steps`` and ``eta`` (0: deterministic, 1: DDPM-like noise), on the steps
  ``0, T/steps, 2 T/steps, ...`` that diffusers' ``DDIMScheduler`` and the official ``"ddimN"`` use.
  ``"dpm-solver++"``: the second-order multistep solver of Lu et al. 2022 through diffusers'
  ``DPMSolverMultistepScheduler`` driving our model (good images in 20-25 steps).
* **guidance** (Ho & Salimans 2022; DiT Sec. 4) runs the conditional and the null-class halves in one batch
  through :meth:`dit_core.models.DiT.forward_with_cfg`: ``eps = eps_null + s (eps_y - eps_null)`` on all noise
  channels, or on the first ``guidance_channels`` (3 reproduces the official sampler and its FID of 2.27).
  ``cfg_scale=1`` is plain conditional sampling and skips the second half (:func:`guided`). With a
  ``guidance_interval`` ``(lo, hi)`` the guidance acts only where the time ``t`` of the path (0: the image, 1:
  pure noise; DiT's timestep over its 1,000) lies in that interval, and the plain model runs elsewhere
  (Kynkäänniemi et al. 2024, arXiv 2404.07724: guidance early on the path costs variety and buys little).
* **reproducible per sample.** Sample ``i`` draws its starting noise, and with DDPM or ``eta > 0`` the noise of
  every step, from its own CPU generator seeded with ``seed + i``. An image therefore depends on its seed and
  label only, not on the batch size, the batch it landed in or the device (up to float round-off of batched
  matrix products). Regenerate image ``i`` alone with ``generate(model, diffusion, [labels[i]], seed=seed + i)``.
* **latent space.** With a ``vae`` the samples are latents, decoded in slices of ``decode_batch_size`` images
  (and with tiled decoding for 512 px and larger), so big batches fit in memory.
* **precision.** ``amp="bf16"``/``"fp16"`` autocasts the transformer (bf16 is about 3x faster than fp32 on CPUs
  with AMX, and the usual choice on GPUs); ``"auto"`` picks bf16 on bf16 GPUs and on CPUs where a measured
  bf16 matmul beats fp32 (:func:`dit_core.runtime.cpu_bf16_is_faster`).
* **the caller's model is left alone.** :func:`generate` never moves, casts or re-modes the model it is given:
  a model in train mode is put in eval mode for the call and back afterwards, and a model that lives on another
  device than ``device`` (the EMA that the 12 GB profile keeps on the CPU, sampled on the GPU for a grid) is
  sampled through a temporary copy on ``device`` (:func:`.placement.sampling_copy`), freed when the call returns. The copy
  is made one tensor at a time (no second CPU copy) in the autocast precision when there is one: 2 bytes a
  parameter with bf16, 1.35 GB for DiT-XL/2's 675 M parameters (fp32: 2.7 GB) on top of what training holds.
* **no null class, no guidance.** A model trained with ``class_dropout_prob: 0`` has no null-class row in its
  label table: it samples with ``cfg_scale=1`` only, and asking for guidance is a clear error.

The images go to files through :mod:`.files`.
"""

from __future__ import annotations

import math

import torch

from ..diffusion import SAMPLERS, SpacedDiffusion, create_diffusion, sampler_objective, space_timesteps
from ..diffusion.flow import sample_flow
from ..diffusion.respace import training_steps
from ..runtime import DTYPES, autocast, resolve_precision
from ..vae import decode_latents
from .dpm import run_dpm
from .placement import eval_mode, model_device, sampling_copy



# ----------------------------------------------------------------------------------------------------------
# Steps, guidance, precision
# ----------------------------------------------------------------------------------------------------------


def _rebuild(diffusion, use_timesteps) -> SpacedDiffusion:
    full = training_steps(diffusion)
    if diffusion.num_timesteps != full:
        raise ValueError(
            f"pass the training diffusion (all {full} steps, create_diffusion('')) when asking for a step count; "
            f"this one is already respaced to {diffusion.num_timesteps} steps"
        )
    return SpacedDiffusion(
        use_timesteps=use_timesteps, betas=diffusion.betas, model_mean_type=diffusion.model_mean_type,
        model_var_type=diffusion.model_var_type, loss_type=diffusion.loss_type,
    )


def respaced(diffusion, steps: int | str | None):
    """The training diffusion with ``steps`` evenly spaced steps kept (e.g. 250 of 1000, first and last
    included: the official ``"250"``); a string is any :func:`space_timesteps` spec; ``None`` keeps it."""
    if steps is None:
        return diffusion
    return _rebuild(diffusion, space_timesteps(training_steps(diffusion), str(steps)))


def ddim_timesteps(num_train_steps: int, steps: int) -> list[int]:
    """``0, k, 2k, ... (steps - 1) k`` with ``k = T // steps``: diffusers' DDIM "leading" spacing, which is the
    official ``"ddimN"`` when ``steps`` divides T (25 -> 0, 40, ..., 960), and exists for every step count."""
    steps = int(steps)
    if not 1 <= steps <= num_train_steps:
        raise ValueError(f"DDIM needs 1..{num_train_steps} steps, got {steps}")
    stride = num_train_steps // steps
    return [i * stride for i in range(steps)]


def has_null_class(model) -> bool:
    """Whether ``model`` has the null class that classifier-free guidance needs: an extra row in its label
    table, which training with ``class_dropout_prob > 0`` teaches (0.1 in the paper)."""
    num_classes = getattr(model, "num_classes", 0)
    table = getattr(getattr(model, "y_embedder", None), "embedding_table", None)
    if not num_classes:
        return False
    if table is None:  # another implementation of the DiT interface: trust its dropout setting
        return float(getattr(model, "class_dropout_prob", 0.1)) > 0
    return table.num_embeddings > num_classes


def check_guidance(model, cfg_scale: float) -> None:
    """A clear error when guidance is asked of a model that has no null class."""
    if cfg_scale != 1.0 and getattr(model, "num_classes", 0) and not has_null_class(model):
        raise ValueError(
            f"cfg_scale {cfg_scale} asks for classifier-free guidance, but this model was trained with "
            "class_dropout_prob 0 and has no null class to guide with. Sample it with cfg_scale 1 "
            "(--cfg-scale 1), or train with class_dropout_prob > 0 (the paper uses 0.1) to use guidance."
        )


def guided(model, cfg_scale: float, guidance_channels: int | None = None, interval=None,
           time_scale: float = 1000.0):
    """``model_fn(x, t, y)`` for a batch of N, as the samplers call it: the plain model when ``cfg_scale`` is 1,
    else the guided half of :meth:`dit_core.models.DiT.forward_with_cfg` on the doubled batch ``[x, x]`` with
    labels ``[y, null class]`` (one forward pass of 2N). ``interval``: ``(lo, hi)``, guide only where the model's
    timestep over ``time_scale`` (the training steps) lies in it (None: everywhere)."""
    if cfg_scale == 1.0 or not getattr(model, "num_classes", 0):
        return lambda x, t, y: model(x, t, y).float()
    check_guidance(model, cfg_scale)
    lo, hi = check_interval(interval) if interval is not None else (0.0, 1.0)

    def model_fn(x, t, y):
        if interval is not None and not lo <= float(t.reshape(-1)[0]) / time_scale <= hi:
            return model(x, t, y).float()  # outside the interval: the conditional model alone
        null = torch.full_like(y, model.num_classes)
        out = model.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]), cfg_scale,
                                     guidance_channels=guidance_channels)
        return out[: len(x)].float()

    return model_fn


def check_interval(interval) -> tuple[float, float]:
    """``(lo, hi)`` with ``0 <= lo < hi <= 1`` (a clear error otherwise)."""
    try:
        lo, hi = (float(v) for v in interval)
    except (TypeError, ValueError):
        raise ValueError(f"a guidance interval is two times (lo, hi) in [0, 1], got {interval!r}") from None
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"a guidance interval needs 0 <= lo < hi <= 1 (0: the image, 1: pure noise), got {interval!r}")
    return lo, hi


def _noise(gens, shape, device) -> torch.Tensor:
    """One standard normal draw of ``shape`` from each per-sample generator (on the CPU, then moved). To a GPU the
    draw goes through pinned memory: a copy from pageable memory makes the host wait until the GPU has finished
    every queued step, a pinned one is queued behind them, so the host keeps launching ahead."""
    z = torch.stack([torch.randn(shape, generator=g) for g in gens])
    if torch.device(device).type == "cuda":
        return z.pin_memory().to(device, non_blocking=True)
    return z.to(device)


# ----------------------------------------------------------------------------------------------------------
# The samplers: each runs one batch from its starting noise x to x_0
# ----------------------------------------------------------------------------------------------------------


def _run_gaussian(diffusion, model_fn, x, y, gens, *, ddim: bool, eta: float, clip_denoised: bool, amp, device,
                  tick, callback):
    """DDPM (ancestral, learned variance: :meth:`GaussianDiffusion.p_sample`) or DDIM
    (:meth:`GaussianDiffusion.ddim_sample`) on a respaced diffusion, each step's noise from the per-sample
    generators (drawn only where a step adds noise, so that the generators' streams do not depend on it)."""
    shape = x.shape[1:]
    n = diffusion.num_timesteps
    for k, i in enumerate(range(n - 1, -1, -1)):
        t = torch.full((len(x),), i, dtype=torch.long, device=device)
        adds_noise = i > 0 and (not ddim or eta > 0)
        noise = _noise(gens, shape, device) if adds_noise else torch.zeros_like(x)
        with autocast(device, amp):
            if ddim:
                out = diffusion.ddim_sample(model_fn, x, t, clip_denoised, model_kwargs=dict(y=y), eta=eta, noise=noise)
            else:
                out = diffusion.p_sample(model_fn, x, t, clip_denoised, model_kwargs=dict(y=y), noise=noise)
        x, x0 = out["sample"].float(), out["pred_xstart"].float()
        tick()
        if callback is not None:
            callback(dict(step=k, num_steps=n, t=int(diffusion.timestep_map[i]) if hasattr(diffusion, "timestep_map")
                          else i, x=x, x0=x0))
    return x


def _run_flow(process, model_fn, x, y, gens, *, sampler: str, steps: int, amp, device, tick, callback):
    """An ODE/SDE sampler of the linear interpolant (:func:`dit_core.diffusion.flow.sample_flow`)."""
    channels = x.shape[1]

    def velocity(xx, t):
        with autocast(device, amp):
            return model_fn(xx, process.model_time(t), y)[:, :channels].float()

    return sample_flow(velocity, x, sampler=sampler, steps=steps, noise=lambda shape: _noise(gens, shape, device),
                       callback=callback, tick=tick)


# ----------------------------------------------------------------------------------------------------------
# generate
# ----------------------------------------------------------------------------------------------------------


@torch.no_grad()
def generate(
    model,
    diffusion=None,
    labels=16,
    *,
    cfg_scale: float = 1.0,
    sampler: str = "ddpm",
    steps: int | str | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    batch_size: int = 64,
    clip_denoised: bool | None = None,
    guidance_channels: int | None = None,
    guidance_interval=None,
    eta: float = 0.0,
    amp: str = "fp32",
    progress: bool = False,
    vae=None,
    vae_scale: float | None = None,
    decode_batch_size: int | None = None,
    vae_tiling: bool | None = None,
    callback=None,
) -> torch.Tensor:
    """Sample one image per entry of ``labels``; returns a float32 CPU tensor ``(N, C, H, W)``.

    - ``labels``: class indices (a list or tensor); for an unconditional model, a number of samples.
    - ``diffusion``: the training diffusion (default: ``create_diffusion("")`` matching ``model.learn_sigma``), or
      the :class:`~dit_core.diffusion.flow.LinearInterpolant` of a flow model (see
      :func:`dit_core.diffusion.create_process`).
    - ``sampler``/``steps``: a name of :data:`dit_core.diffusion.SAMPLERS`, which gives each one's default
      number of steps: ``"ddpm"`` (all steps; the paper uses 250), ``"ddim"`` (``eta`` 0 deterministic) or
      ``"dpm-solver++"`` for DiT's diffusion; ``"euler"`` (= ``"ddim"``), ``"heun"`` or ``"euler-maruyama"``
      for a flow model.
    - ``cfg_scale``/``guidance_channels``: classifier-free guidance scale, and how many noise channels it
      acts on (None: all; 3: the official sampler); ``guidance_interval``: ``(lo, hi)``, guidance only for the
      times of the path in it (0: the image, 1: noise; None: everywhere).
    - ``clip_denoised``: clamp the predicted x_0 to [-1, 1]; default True in pixel space (the result is an
      image in [-1, 1]) and False with a ``vae`` (latents are not bounded).
    - ``vae``: a diffusers ``AutoencoderKL``: the samples are latents, divided by ``vae_scale`` (default:
      the VAE's ``scaling_factor``, 0.18215) and decoded ``decode_batch_size`` at a time; ``vae_tiling``
      (default: for 512 px and up) decodes in overlapping tiles. Returns images in [-1, 1].
    - ``amp``: ``"fp32"``, ``"bf16"``, ``"fp16"`` or ``"auto"`` autocast of the transformer.
    - ``device``: where to sample (default: where the model is). The model itself is never moved, cast or left
      in another mode: on another device it is sampled through a temporary copy (:func:`sampling_copy`).
    - ``callback(info)``: called after every step with ``step``, ``num_steps``, ``t`` (original index),
      ``x`` (the current batch) and ``x0`` (the predicted clean batch; None for dpm-solver++).
    """
    flow = getattr(diffusion, "is_interpolant", False)  # objective "flow": the samplers of dit_core.diffusion.flow
    sampler = sampler_objective(str(sampler).lower(), "flow" if flow else "ddpm")
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    if eta != 0.0 and (flow or sampler != "ddim"):
        raise ValueError(f"eta is a DDIM setting; sampler {sampler!r} does not take it")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if isinstance(labels, int):
        labels = [0] * labels
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1).cpu()
    num_classes = getattr(model, "num_classes", 0)
    if num_classes and ((labels < 0) | (labels >= num_classes)).any():
        bad = sorted(set(labels[(labels < 0) | (labels >= num_classes)].tolist()))
        raise ValueError(f"labels must lie in 0..{num_classes - 1} for this model, got {bad[:10]}")
    here = model_device(model)
    device = torch.device(device) if device is not None else here
    if device.type == here.type and device.index is None:  # "cuda" is the model's GPU when it is on one
        device = here
    amp = resolve_precision(amp, device)
    weights = next(model.parameters()).dtype
    if amp == "fp32" and weights in (torch.bfloat16, torch.float16):  # half weights need autocast for fp32 inputs
        amp = "bf16" if weights == torch.bfloat16 else "fp16"
    check_guidance(model, cfg_scale)
    if guidance_interval is not None:
        guidance_interval = check_interval(guidance_interval)
    args = dict(cfg_scale=cfg_scale, sampler=sampler, steps=steps, seed=seed, device=device, batch_size=batch_size,
                clip_denoised=clip_denoised, guidance_channels=guidance_channels,
                guidance_interval=guidance_interval, eta=eta, amp=amp,
                progress=progress, vae=vae, vae_scale=vae_scale, decode_batch_size=decode_batch_size,
                vae_tiling=vae_tiling, callback=callback)
    if here != device:  # sample a temporary copy where asked; the caller's model stays where it is
        copy_dtype = DTYPES[amp] if amp in ("bf16", "fp16") else None
        # the copy is referenced by _generate's frame only: freed when it returns (its GPU memory goes back
        # to PyTorch's allocator, for the training to reuse)
        return _generate(sampling_copy(model, device, copy_dtype), diffusion, labels, **args)
    with eval_mode(model):
        return _generate(model, diffusion, labels, **args)


def _generate(model, diffusion, labels, *, cfg_scale, sampler, steps, seed, device, batch_size,
              clip_denoised, guidance_channels, guidance_interval, eta, amp, progress, vae, vae_scale,
              decode_batch_size, vae_tiling, callback):
    """:func:`generate` once the model is in eval mode on ``device`` and the arguments are checked."""
    if diffusion is None:
        diffusion = create_diffusion("", learn_sigma=getattr(model, "learn_sigma", True))
    if clip_denoised is None:
        clip_denoised = vae is None
    if steps is None:
        steps = SAMPLERS[sampler][1]
    if sampler == "ddpm":
        spaced = respaced(diffusion, steps)
    elif sampler == "ddim":
        spaced = _rebuild(diffusion, ddim_timesteps(training_steps(diffusion), int(steps)))
    else:
        spaced = diffusion
    num_steps = spaced.num_timesteps if sampler in ("ddpm", "ddim") else int(steps)
    shape = (model.in_channels, model.input_size, model.input_size)
    time_scale = diffusion.num_timesteps if getattr(diffusion, "is_interpolant", False) else training_steps(diffusion)
    model_fn = guided(model, cfg_scale, guidance_channels, guidance_interval, time_scale)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_steps * math.ceil(len(labels) / batch_size), desc=f"{sampler} x {len(labels)} images",
                   unit="step")
    tick = bar.update if bar is not None else (lambda: None)
    out = []
    try:
        for start in range(0, len(labels), batch_size):
            y = labels[start : start + batch_size].to(device)
            gens = [torch.Generator().manual_seed(int(seed) + start + j) for j in range(len(y))]
            x = _noise(gens, shape, device)
            batch_callback = None
            if callback is not None:
                batch_callback = lambda info, s=start: callback(dict(info, batch_start=s))  # noqa: E731
            if getattr(diffusion, "is_interpolant", False):  # objective "flow"
                x = _run_flow(diffusion, model_fn, x, y, gens, sampler=sampler, steps=int(steps), amp=amp, device=device,
                              tick=tick, callback=batch_callback)
            elif sampler == "dpm-solver++":
                x = run_dpm(diffusion, model_fn, x, y, steps=int(steps), clip_denoised=clip_denoised, amp=amp,
                             device=device, tick=tick, callback=batch_callback)
            else:
                x = _run_gaussian(spaced, model_fn, x, y, gens, ddim=sampler == "ddim", eta=eta,
                                  clip_denoised=clip_denoised, amp=amp, device=device, tick=tick,
                                  callback=batch_callback)
            if vae is not None:
                x = decode_latents(vae, x, scale=vae_scale, batch_size=decode_batch_size, tiling=vae_tiling)
            elif clip_denoised:
                x = x.clamp(-1, 1)
            out.append(x.float().cpu())
    finally:
        if bar is not None:
            bar.close()
    if out:
        return torch.cat(out)
    return torch.empty(0, *shape)
