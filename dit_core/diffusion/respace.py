"""Respacing: sample (or train) with a subset of the original timesteps.

A model trained on T = 1000 steps can be sampled with far fewer (DiT evaluates with 250). Keep the steps
k_1 < k_2 < ... < k_S and build a new, shorter diffusion whose cumulative products are the kept ones:
alpha_bar'_i = alpha_bar_{k_i}. Its betas follow from beta'_i = 1 - alpha_bar_{k_i} / alpha_bar_{k_{i-1}}
(Nichol & Dhariwal 2021, Sec. 4; Song et al. 2021, Sec. 4.2 for DDIM).

The network still expects the original step numbers: step i of the short process calls the model with k_i
(the map is held as a tensor on each device it is used on). Timesteps are passed as integers, unscaled (DiT's
convention).
"""

import numpy as np
import torch

from .gaussian import GaussianDiffusion, schedule_arrays


def space_timesteps(num_timesteps, section_counts):
    """Choose which of ``num_timesteps`` original steps to keep; returns a set of indices.

    ``section_counts`` is one of:

    * ``"ddimN"`` -- the DDIM rule: the smallest integer stride s with exactly N steps in
      ``range(0, num_timesteps, s)``; for 1000 steps ``"ddim25"`` keeps 0, 40, ..., 960.
    * ``"N"`` or an int -- N steps spread evenly over [0, num_timesteps - 1], first and last included:
      step j is ``round(j * (num_timesteps - 1) / (N - 1))`` (accumulated in floating point, rounding
      half to even, like the official code). For 1000 steps ``"250"`` keeps 0, 4, 8, ..., 995, 999
      (gaps of 4 and 5), not ``range(0, 1000, 4)``, which is ``"ddim250"``.
    * ``"N1,N2,..."`` or a list -- split the steps into equal sections and space each section as above:
      with 300 steps, ``"10,15,20"`` takes 10 steps from the first 100, 15 from the next 100, 20 from the
      last 100.
    """
    if isinstance(section_counts, str):
        text = section_counts.strip()
        if text.startswith("ddim"):
            return _ddim_timesteps(num_timesteps, text[len("ddim"):], section_counts)
        try:
            section_counts = [int(part) for part in text.split(",")]
        except ValueError:
            raise ValueError(
                f"cannot read timestep_respacing {section_counts!r}: use a number of steps like '250', "
                "'ddim25' for a DDIM stride, comma-separated counts like '10,20', or '' for all steps."
            ) from None
    elif isinstance(section_counts, (int, np.integer)):
        section_counts = [int(section_counts)]
    section_counts = list(section_counts)
    if not section_counts or any(c < 0 for c in section_counts) or sum(section_counts) < 1:
        raise ValueError(f"timestep_respacing needs positive step counts, got {section_counts}.")

    size_per = num_timesteps // len(section_counts)
    extra = num_timesteps % len(section_counts)  # the first `extra` sections get one more step
    start = 0
    kept = []
    for i, count in enumerate(section_counts):
        size = size_per + (1 if i < extra else 0)
        if size < count:
            raise ValueError(
                f"cannot take {count} steps from a section of {size} steps "
                f"({num_timesteps} steps split into {len(section_counts)} sections); ask for fewer steps."
            )
        stride = 1 if count <= 1 else (size - 1) / (count - 1)
        position = 0.0
        for _ in range(count):
            kept.append(start + round(position))
            position += stride
        start += size
    return set(kept)


def _ddim_timesteps(num_timesteps, count_text, original):
    try:
        desired = int(count_text)
    except ValueError:
        raise ValueError(f"cannot read {original!r}: DDIM respacing is 'ddim' followed by a step count, e.g. 'ddim25'.") from None
    possible = {}
    for stride in range(1, num_timesteps + 1):
        possible.setdefault(len(range(0, num_timesteps, stride)), stride)
    if desired in possible:
        return set(range(0, num_timesteps, possible[desired]))
    below = max((c for c in possible if c < desired), default=None)
    above = min((c for c in possible if c > desired), default=None)
    nearby = " or ".join(f"'ddim{c}'" for c in (below, above) if c is not None)
    raise ValueError(
        f"cannot take exactly {desired} steps out of {num_timesteps} with an integer stride ({original!r}); "
        f"use {nearby}, or '{desired}' for evenly spaced steps without a fixed stride."
    )


def training_steps(diffusion) -> int:
    """The number of steps the diffusion was trained with (that of the original process when it is respaced)."""
    return getattr(diffusion, "original_num_steps", diffusion.num_timesteps)


class SpacedDiffusion(GaussianDiffusion):
    """A :class:`GaussianDiffusion` that keeps only the steps in ``use_timesteps``.

    :param use_timesteps: the original step indices to keep (see :func:`space_timesteps`).
    :param kwargs: the arguments of the original :class:`GaussianDiffusion` (``betas`` has all T steps).

    ``timestep_map[i]`` is the original index of step i; models see original indices.
    """

    def __init__(self, use_timesteps, **kwargs):
        trained = schedule_arrays(kwargs.pop("betas"))
        self.original_num_steps = len(trained["beta"])
        self.use_timesteps = set(int(k) for k in use_timesteps)
        if not self.use_timesteps or min(self.use_timesteps) < 0 or max(self.use_timesteps) >= self.original_num_steps:
            raise ValueError(
                f"use_timesteps must be a non-empty set of indices in 0..{self.original_num_steps - 1}."
            )
        self.timestep_map = sorted(self.use_timesteps)
        kept = trained["alpha_bar"][self.timestep_map]
        super().__init__(betas=1.0 - kept / np.append(1.0, kept[:-1]), **kwargs)
        self._step_maps: dict = {}  # (device, dtype) -> timestep_map as a tensor there

    def _model_steps(self, t):
        """Step i of this shorter process is step ``timestep_map[i]`` of the one the model was trained on."""
        key = (t.device, t.dtype)
        if key not in self._step_maps:
            self._step_maps[key] = torch.tensor(self.timestep_map, dtype=t.dtype, device=t.device)
        return self._step_maps[key][t]
