"""Generating images from a DiT, and the files they go to.

- :mod:`.samplers`: :func:`generate`: classifier-free guidance, DDPM / DDIM / DPM-Solver++, pixels or VAE
  latents, reproducible per sample;
- :mod:`.dpm`: DPM-Solver++ through diffusers' scheduler (``sampler="dpm-solver++"``);
- :mod:`.placement`: a temporary copy of the model on the sampling device, eval mode for the call only;
- :mod:`.files`: labelled PNG grids, the FID ``.npz`` (also streamed), opening a checkpoint for sampling
  (:func:`load_model`);
- :mod:`.shards`: FID-scale sampling: 50,000 images in resumable shards, split across processes, assembled
  into one ``.npz``; uniform or balanced labels.

``dit-sample`` is the command line (:mod:`dit_core.cli.sample`).
"""

from .files import load_model, make_grid, parse_classes, save_grid, save_npz, to_uint8
from .dpm import dpm_solver_scheduler
from .placement import sampling_copy
from .samplers import check_guidance, check_interval, ddim_timesteps, generate, guided, has_null_class, respaced

__all__ = ["check_guidance", "check_interval", "ddim_timesteps", "dpm_solver_scheduler", "generate", "guided", "has_null_class",
           "load_model", "make_grid", "parse_classes", "respaced", "sampling_copy",
           "save_grid", "save_npz", "to_uint8"]
