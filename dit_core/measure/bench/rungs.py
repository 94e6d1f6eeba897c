"""What the benchmark ladder measures: the workload (:class:`BenchSpec`) and the rungs, as plain data.

Each *rung* of the ladder is the training step of ``dit-train`` (:class:`dit_core.train.step.TrainStep`) on
the same workload (model, image size, batch), run with one trick switched on (or all of them), so every
speed-up is a ratio measured in one run, on this machine:

===============  =============================================================================================
rung (key)       what changes
===============  =============================================================================================
``baseline``     fp32, explicit ("math") attention, eager PyTorch; latent models encode with the VAE every step
``ckpt``         + gradient checkpointing: each block recomputes its forward in backward (less memory, ~1/3
                 more compute)
``amp``          + mixed precision: bf16 autocast (fp16 + gradient scaler on GPUs without bf16); fp32 weights
``latents``      + pre-extracted VAE latents: the encoder leaves the loop (latent models only)
``sdpa``         + fused attention: ``scaled_dot_product_attention`` (FlashAttention / memory-efficient)
``tf32``         + TF32 tensor cores for fp32 matrix products (GPU only; the official code turns it on)
``compile``      + ``torch.compile`` of each block (regional compilation: all blocks share one compile)
``all``          every trick above, checkpointing included (the fast-DiT recipe and more)
``all-no-ckpt``  every trick but checkpointing: the fastest, when the memory allows it
``official``     the reference: the step as the official ``train.py`` runs it. fp32 weights and arithmetic with
                 TF32 on (its first lines set ``allow_tf32`` for matmuls and cuDNN), fused attention (timm's
                 ``Attention`` calls ``F.scaled_dot_product_attention``), the VAE encoder in the loop, PyTorch's
                 default AdamW, ``zero_grad`` after the forward pass, no clipping, no NaN guard
``official-fp32``  the same step in strict fp32: TF32 off and explicit ("math") attention. The paper's runs
                 were made without TF32; its authors then measured 0.51 -> 0.81 steps/s on 8 A100s from the two
                 TF32 lines alone (github.com/facebookresearch/DiT issue 22). Not the reference: a speed-up over
                 it would count TF32, which the official code already has, as a trick of ours
===============  =============================================================================================

A rung is a :class:`Rung` record; a new one is a line in :data:`RUNGS` (or a ``Rung`` passed to
:func:`dit_core.measure.bench.ladder.run_benchmark`). :func:`step_options` turns a rung into the options of
the training step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ...runtime import resolve_precision
from ...train.step import StepOptions
from ..memory import ModelShape


@dataclass(frozen=True)
class Rung:
    """One configuration of the ladder: which tricks are on."""

    key: str
    label: str
    checkpointing: bool | int = False  # True: every block; an int k: the first k blocks
    amp: bool = False
    latents: bool = False  # pre-extracted latents instead of the VAE in the loop
    fused_attention: bool = False
    tf32: bool = False
    compile: bool = False
    official: bool = False


RUNGS = {
    r.key: r
    for r in (
        Rung("baseline", "baseline (fp32, math attn, VAE if latent)"),
        Rung("ckpt", "+ gradient checkpointing", checkpointing=True),
        Rung("amp", "+ mixed precision", amp=True),
        Rung("latents", "+ pre-extracted latents", latents=True),
        Rung("sdpa", "+ fused attention (sdpa)", fused_attention=True),
        Rung("tf32", "+ TF32 matmuls", tf32=True),
        Rung("compile", "+ torch.compile", compile=True),
        Rung("all", "all together", checkpointing=True, amp=True, latents=True, fused_attention=True, tf32=True,
             compile=True),
        Rung("all-no-ckpt", "all but checkpointing", amp=True, latents=True, fused_attention=True, tf32=True,
             compile=True),
        Rung("all-eager", "all together, without compile", checkpointing=True, amp=True, latents=True,
             fused_attention=True, tf32=True),
        Rung("all-no-ckpt-eager", "all but checkpointing and compile", amp=True, latents=True, fused_attention=True,
             tf32=True),
        Rung("official", "official train.py step (fp32+TF32, sdpa)", official=True, fused_attention=True, tf32=True),
        Rung("official-fp32", "official step, strict fp32 (no TF32, math)", official=True),
    )
}


def default_rungs(device_type: str, pixel: bool, official: bool = True, compile: bool = True) -> list[str]:
    """The ladder for a device: TF32 only on GPUs (so the strict-fp32 official step too: on a CPU it would
    differ from the reference only in its attention), the latents rung only for latent models."""
    keys = ["baseline", "ckpt", "amp", "latents", "sdpa", "tf32", "compile", "all", "all-no-ckpt"]
    if pixel:
        keys.remove("latents")
    if device_type != "cuda":
        keys.remove("tf32")
    if not compile:
        keys = [k for k in keys if k != "compile"]
        keys = [k + "-eager" if k.startswith("all") else k for k in keys]
    refs = (["official"] + (["official-fp32"] if device_type == "cuda" else [])) if official else []
    return refs + keys


@dataclass

class BenchSpec:
    """The workload: a model, an input size, a batch, and how to time it. Plain data (JSON in, JSON out)."""

    model: str = "DiT-S/2"  # a named configuration, or a profile ("digits")
    shape: dict = field(default_factory=dict)  # ModelShape fields (filled by resolve_spec)
    pixel: bool = False  # pixel-space model (no VAE) instead of a latent model
    image_size: int = 256
    batch_size: int = 4  # the micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step (images per step = batch_size x grad_accum)
    steps: int = 3
    warmup: int = 1
    device: str = "auto"
    precision: str = "auto"  # the autocast dtype of the amp rungs: auto, bf16, fp16
    vae: str | None = None  # a VAE to load (hub id or folder); None: random init of SD_VAE_CONFIG
    threads: int | None = None
    seed: int = 0
    track_tensors: bool = True  # CPU: also measure the peak of live tensor bytes (eager rungs)
    sample_steps: int = 10
    sampler: str = "ddim"
    cfg_scale: float = 4.0
    sample_batch: int = 2
    sample_decode: bool = True
    memory_limit_gib: float | None = None  # CUDA: cap the allocator at this much, as on a smaller card


def as_rung(rung: "str | Rung | dict") -> Rung:
    """A :class:`Rung` from its key in :data:`RUNGS`, a ``Rung``, or its fields as a dict (JSON)."""
    if isinstance(rung, Rung):
        return rung
    if isinstance(rung, dict):
        return Rung(**rung)
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}; choose from {', '.join(RUNGS)}")
    return RUNGS[rung]


def step_options(spec: "BenchSpec", rung: Rung, device: torch.device) -> StepOptions:
    """The training step's options for ``rung``: the trainer's step, or the official ``train.py``'s."""
    precision = resolve_precision(spec.precision, device, "reduced") if rung.amp else "fp32"
    base = StepOptions.official() if rung.official else StepOptions()
    return replace(base, grad_accum=spec.grad_accum, precision=precision)


def profile_shape(name: str) -> tuple[dict, int, bool]:
    """Model fields, image size and pixel-space flag of a training profile (``dit_core/configs/<name>.yaml``),
    with the model the trainer would build for it (digits: 10 classes; latents: 4 channels, 1000 classes)."""
    from ...train.config import ConfigError, make_config
    from ...train.loop import dit_arguments

    try:
        cfg = make_config(name)
    except ConfigError as err:
        raise ValueError(f"unknown model or profile {name!r}: use a DiT name (DiT-S/2 ... DiT-XL/2) or a profile "
                         f"({err})") from None
    pixel = not cfg.latents_path and cfg.data_path == "digits"
    image = cfg.image_size
    sample_shape, classes = ((cfg.channels, image, image), 10) if pixel else ((4, image // 8, image // 8), 1000)
    kwargs = dit_arguments(cfg, sample_shape, classes)
    return {k: kwargs[k] for k in ModelShape.constructor_keys() if k in kwargs}, image, pixel


def resolve_spec(spec: BenchSpec) -> BenchSpec:
    """Fill ``spec.shape`` (and pixel/image size for a profile) from ``spec.model``.

    A spec may also bring its own ``shape`` (``ModelShape`` fields, e.g. a tiny model for tests); its input
    side must then agree with ``image_size`` (equal in pixel space, ``image_size / 8`` for latents).
    """
    if spec.shape:
        side = spec.shape.get("input_size")
        want = spec.image_size if spec.pixel else spec.image_size // 8
        if side != want:
            raise ValueError(f"shape input_size {side} does not match image_size {spec.image_size} "
                             f"({'pixel space: equal' if spec.pixel else 'latents: image_size / 8'})")
        return spec
    if spec.model.startswith("DiT-"):
        shape = ModelShape.from_name(spec.model, spec.image_size)
        kwargs = shape.model_kwargs()
        if spec.pixel:
            raise ValueError("named DiT models are latent models; use a profile (e.g. digits) for pixel space")
        return replace(spec, shape=kwargs)
    kwargs, image, pixel = profile_shape(spec.model)
    return replace(spec, shape=kwargs, image_size=image, pixel=pixel)


def model_shape(spec: BenchSpec) -> ModelShape:
    return ModelShape(name=spec.model, **resolve_spec(spec).shape)


def train_gflop_per_image(shape: ModelShape) -> float:
    """Model FLOPs of one training image: 3 forward passes (forward + 2x for backward), 2 FLOPs per MAC."""
    from ...models import DiT
    from ..flops import forward_macs

    with torch.device("meta"):
        model = DiT(**shape.model_kwargs())
    return 6 * forward_macs(model) / 1e9
