"""A DiT outside PyTorch: its forward as an ONNX file, and the sampler's numbers as plain data.

Sampling is a loop around one network call (DiT Sec. 3.1): the network predicts the noise (and the variance
interpolation) of ``x_t``; the sampler turns that into ``x_{t-1}`` with a handful of per-step numbers of the noise
schedule. To run the same loop in another runtime (the book's live sampler runs it in the reader's browser with
ONNX Runtime Web), this module hands over both halves, computed by the library itself:

* :func:`export_onnx` writes the model's own :meth:`~dit_core.models.DiT.forward` ``(x, t, y) -> output`` as an
  ONNX graph with ``torch.onnx.export`` (the ``torch.export``-based exporter; it needs the ``onnx`` and
  ``onnxscript`` packages). The batch size stays free, so one file serves the conditional batch and the doubled
  batch of classifier-free guidance (labels, then the null class ``num_classes``). The parameters keep their
  PyTorch names (the graph is not optimised here; runtimes optimise it when they load it), and the file carries
  the model's constructor arguments, so :func:`dit_from_onnx` rebuilds the PyTorch model from the file alone.
* :func:`sampling_tables` lists, for DDIM (``eta`` 0) and DDPM with a given step count, the step numbers the
  network is called with and every coefficient the update needs, in the order the sampler visits them: the
  respaced schedule of :mod:`dit_core.diffusion.respace`, as float32, the precision
  :class:`~dit_core.diffusion.gaussian.GaussianDiffusion` computes the update in.

With these, one step of :func:`dit_core.sample.generate` (pixel space, ``clip_denoised``) is, for step ``k``::

    eps, v = out[:, :C], out[:, C:]                    # guided eps: uncond + s * (cond - uncond)
    x0  = clamp(sqrt_recip_alpha_bar[k] * x - sqrt_recipm1_alpha_bar[k] * eps, -1, 1)
    DDIM: eps' = (sqrt_recip_alpha_bar[k] * x - x0) / sqrt_recipm1_alpha_bar[k]
          x    = x0 * sqrt(alpha_bar_prev[k]) + sqrt(1 - alpha_bar_prev[k]) * eps'           (Song et al. eq. 12)
    DDPM: mean = posterior_coef_x0[k] * x0 + posterior_coef_xt[k] * x                        (DDPM eq. 7)
          log_var = f * log_var_max[k] + (1 - f) * log_var_min[k],  f = (v + 1) / 2          (Improved DDPM eq. 15)
          x    = mean + exp(log_var / 2) * z   (no noise at the last step)
"""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from .diffusion.gaussian import ModelMeanType, ModelVarType
from .diffusion.respace import training_steps

#: The metadata key of the exported file that holds :meth:`DiT.config` as JSON.
CONFIG_KEY = "dit_config"
INPUT_NAMES = ("x", "t", "y")
OUTPUT_NAME = "out"
#: The samplers :func:`sampling_tables` describes.
TABLE_SAMPLERS = ("ddim", "ddpm")


def _onnx_modules():
    try:
        import onnx
        import onnxscript  # noqa: F401 - torch.onnx.export's exporter imports it
    except ImportError as err:
        raise ImportError(
            f"exporting a DiT to ONNX needs the onnx and onnxscript packages ({err.name} is missing): "
            'pip install onnx onnxscript (they come with the book extra: pip install -e ".[book]")'
        ) from None
    return onnx


def export_onnx(model, path: str | os.PathLike | None = None, *, batch_size: int = 2, opset: int | None = None,
                metadata: dict | None = None, config: dict | None = None) -> bytes:
    """The ONNX bytes of ``model``'s forward ``(x, t, y) -> output``; also written to ``path`` when given.

    Inputs: ``x`` float32 ``(N, C, H, W)``, ``t`` int64 ``(N,)`` trained step numbers, ``y`` int64 ``(N,)``
    labels (``num_classes`` is the null class); output ``out`` float32 ``(N, C_out, H, W)``. ``N`` is free;
    ``batch_size`` only sizes the example the exporter traces. The model is exported from an fp32 CPU copy in
    eval mode (the caller's model is left alone). ``metadata``: more string entries for the file's
    ``metadata_props`` beside the model's config. ``opset``: the ONNX opset (default: the exporter's).
    ``config``: the :class:`~dit_core.models.DiT` constructor arguments that rebuild the network
    (:func:`dit_from_onnx`), for a model of another class with DiT's parameters (a DiT written by a reader of the
    book, whose parameter names are the official ones); by default ``model.config()``.
    """
    onnx = _onnx_modules()
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 6):
        raise RuntimeError(f"export_onnx uses the torch.export-based ONNX exporter of PyTorch 2.6 and newer; this is "
                           f"torch {torch.__version__}: pip install 'torch>=2.6'")
    if config is None and hasattr(model, "config"):
        config = model.config()
    if config is None or not getattr(model, "num_classes", 0):
        raise ValueError("export_onnx exports a class-conditional DiT (num_classes > 0) with its config: a dit_core "
                         "DiT, or another class with DiT's parameters and config= the DiT arguments that rebuild it")
    if batch_size < 2:
        raise ValueError(f"batch_size must be at least 2 (a batch of 1 would fix the batch size), got {batch_size}")
    net = copy.deepcopy(model).float().cpu().eval()
    for p in net.parameters():
        p.requires_grad_(False)
    c, s = net.in_channels, net.input_size
    gen = torch.Generator().manual_seed(0)
    example = (torch.randn(batch_size, c, s, s, generator=gen),
               torch.randint(0, 1000, (batch_size,), generator=gen),
               torch.randint(0, net.num_classes, (batch_size,), generator=gen))
    batch = torch.export.Dim("batch", min=1)
    kwargs = dict(input_names=list(INPUT_NAMES), output_names=[OUTPUT_NAME], dynamo=True, optimize=False,
                  verbose=False, external_data=False, dynamic_shapes=({0: batch}, {0: batch}, {0: batch}))
    if opset is not None:
        kwargs["opset_version"] = opset
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::nms" and the like
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(net, example, **kwargs)
    finally:
        quiet.setLevel(level)
    proto = program.model_proto
    props = {CONFIG_KEY: json.dumps(config), **{k: str(v) for k, v in (metadata or {}).items()}}
    onnx.helper.set_model_props(proto, props)
    data = proto.SerializeToString()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
    return data


def onnx_metadata(source) -> dict:
    """The ``metadata_props`` of an exported file (path or bytes) as a dict; ``dit_config`` parsed."""
    onnx = _onnx_modules()
    proto = onnx.load_model_from_string(_read(source))
    props = {p.key: p.value for p in proto.metadata_props}
    if CONFIG_KEY in props:
        props[CONFIG_KEY] = json.loads(props[CONFIG_KEY])
    return props


def dit_from_onnx(source):
    """Rebuild the PyTorch :class:`~dit_core.models.DiT` of a file written by :func:`export_onnx` (a path or the
    bytes): its constructor arguments from the metadata, every parameter from the graph's initializer of the same
    name. A file from elsewhere (no ``dit_config``, renamed weights) is refused with the reason."""
    onnx = _onnx_modules()
    from onnx import numpy_helper

    from .models import DiT

    proto = onnx.load_model_from_string(_read(source))
    props = {p.key: p.value for p in proto.metadata_props}
    if CONFIG_KEY not in props:
        raise ValueError(f"this ONNX file has no {CONFIG_KEY!r} metadata: it was not written by "
                         "dit_core.export.export_onnx, which records the model's config")
    model = DiT(**json.loads(props[CONFIG_KEY]))
    weights = {init.name: init for init in proto.graph.initializer}
    state = {}
    for name, value in model.state_dict().items():
        if name not in weights:
            raise ValueError(f"the ONNX file has no initializer {name!r}: export it with export_onnx (which keeps "
                             "the parameter names) to rebuild the model from it")
        array = numpy_helper.to_array(weights[name])
        if tuple(array.shape) != tuple(value.shape):
            raise ValueError(f"initializer {name!r} has shape {array.shape}, the model expects {tuple(value.shape)}")
        state[name] = torch.from_numpy(array.copy())
    model.load_state_dict(state)
    return model.eval()


def _read(source) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, io.IOBase):
        return source.read()
    return Path(source).read_bytes()


def sampling_tables(diffusion, sampler: str, steps: int) -> dict:
    """The per-step numbers of ``sampler`` (``"ddim"`` with ``eta`` 0, or ``"ddpm"``) over ``steps`` steps of the
    training ``diffusion`` (all its steps, as :func:`dit_core.sample.generate` takes it), as plain lists in the
    order the sampler visits the steps (the noisiest first).

    The steps are those :func:`~dit_core.sample.generate` samples: DDIM's ``0, T/steps, ...``
    (:func:`~dit_core.sample.samplers.ddim_timesteps`), DDPM's evenly spaced ones
    (:func:`~dit_core.sample.samplers.respaced`). ``t`` holds the trained step number the network is called with
    at each step; the other lists are the respaced diffusion's schedule at that step as float32 values (see the
    module docstring for the update they enter). ``variance`` says how DDPM's variance is chosen: ``"learned-range"``
    interpolates ``log_var_min`` and ``log_var_max`` with the network's second half of channels; ``"fixed"`` uses
    ``log_var``.
    """
    from .sample.samplers import _rebuild, ddim_timesteps, respaced

    if getattr(diffusion, "is_interpolant", False):
        raise ValueError("sampling_tables describes DiT's Gaussian diffusion; a flow model (objective 'flow') has "
                         "its own samplers (dit_core.diffusion.flow)")
    if diffusion.model_mean_type != ModelMeanType.EPSILON:
        raise ValueError("sampling_tables needs a diffusion whose model predicts the noise (DiT's choice)")
    sampler = str(sampler).lower()
    if sampler not in TABLE_SAMPLERS:
        raise ValueError(f"sampling_tables describes {' and '.join(TABLE_SAMPLERS)}, not {sampler!r}")
    steps = int(steps)
    if sampler == "ddim":
        spaced = _rebuild(diffusion, ddim_timesteps(training_steps(diffusion), steps))
    else:
        spaced = respaced(diffusion, steps)
    order = list(range(spaced.num_timesteps - 1, -1, -1))
    timestep_map = getattr(spaced, "timestep_map", list(range(spaced.num_timesteps)))

    def column(name):
        return np.asarray(spaced.schedule[name], dtype=np.float32)[order].tolist()

    tables = {"sampler": sampler, "steps": spaced.num_timesteps, "t": [int(timestep_map[i]) for i in order],
              "sqrt_recip_alpha_bar": column("sqrt_recip_alpha_bar"),
              "sqrt_recipm1_alpha_bar": column("sqrt_recipm1_alpha_bar")}
    if sampler == "ddim":
        tables["alpha_bar_prev"] = column("alpha_bar_prev")
        return tables
    tables["posterior_coef_x0"] = column("posterior_coef_x0")
    tables["posterior_coef_xt"] = column("posterior_coef_xt")
    if spaced.model_var_type == ModelVarType.LEARNED_RANGE:
        tables.update(variance="learned-range", log_var_max=column("log_beta"), log_var_min=column("posterior_log_var"))
    else:
        fixed = "large_log_var" if spaced.model_var_type == ModelVarType.FIXED_LARGE else "posterior_log_var"
        tables.update(variance="fixed", log_var=column(fixed))
    return tables

