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

Beyond the fast-DiT ladder, rungs closer to the hardware, each changing one thing of ``all-no-ckpt``
(``benchmarks/gpu_speed.sh`` measures them):

=========================  ===================================================================================
``compile-model``          ``torch.compile`` of the whole model as one graph (embeddings, final layer and every
                           block), not only each block: fewer graph boundaries, a longer compile
``compile-autotune``       the blocks compiled with ``mode="max-autotune-no-cudagraphs"``: inductor times
                           several matrix-product kernels per shape and keeps the fastest (minutes of compile)
``attn-cudnn``             SDPA pinned to cuDNN's fused attention (Hopper); ``attn-flash``: to FlashAttention-2
``ema-every-4``            the EMA updated every 4 optimizer steps with the decay raised to the 4th power (the
                           trainer's ``ema_every``): a quarter of the EMA's memory traffic
``fastest``                the cheap ones together: blocks compiled, cuDNN attention, EMA every 4 steps
=========================  ===================================================================================

The planner's estimate does not depend on these settings (the same tensors are saved for backward: a pinned SDPA
kernel saves one log-sum-exp per head like PyTorch's own choice, the EMA and compile scope change no peak it
predicts), so their rows are checked against it like the others.

A rung is a :class:`Rung` record; a new one is a line in :data:`RUNGS` (or a ``Rung`` passed to
:func:`dit_core.measure.bench.ladder.run_benchmark`). :func:`step_options` turns a rung into the options of
the training step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ...runtime import resolve_precision
from ...train.step import StepOptions
from .. import memory
from ..memory import ModelShape, TrainSetup, VaeShape


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
    compile_scope: str | None = None  # "blocks": each block (one shared compile); "model": the whole model;
    # None: runtime.default_compile_scope (blocks on a GPU, the whole model on the CPU)
    compile_mode: str | None = None  # torch.compile's mode, e.g. "max-autotune-no-cudagraphs"
    attn_kernel: str | None = None  # pin an SDPA kernel: "flash", "cudnn", "efficient" (None: PyTorch picks)
    ema_every: int = 1  # EMA update every N optimizer steps


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
        *(Rung(key, label, amp=True, latents=True, fused_attention=True, tf32=True, compile=True, **extra)
          for key, label, extra in (
              ("compile-model", "all but ckpt, compile whole model", dict(compile_scope="model")),
              ("compile-autotune", "all but ckpt, compile max-autotune", dict(compile_mode="max-autotune-no-cudagraphs")),
              ("attn-cudnn", "all but ckpt, cuDNN attention", dict(attn_kernel="cudnn")),
              ("attn-flash", "all but ckpt, flash attention pinned", dict(attn_kernel="flash")),
              ("ema-every-4", "all but ckpt, EMA every 4 steps", dict(ema_every=4)),
              ("fastest", "all but ckpt, cuDNN attention, EMA/4", dict(attn_kernel="cudnn", ema_every=4)),
          )),
        Rung("official-fp32", "official step, strict fp32 (no TF32, math)", official=True),
    )
}


#: The rungs closer to the hardware that a GPU ladder adds to :func:`default_rungs` (chapter 06;
#: ``benchmarks/gpu_speed.sh``).
HARDWARE_RUNGS = ("compile-model", "attn-cudnn", "ema-every-4", "fastest")


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
    sample_compile: str | None = None  # sampling: torch.compile "blocks" or the whole "model" (None: eager)
    sample_compile_mode: str | None = None  # e.g. "reduce-overhead": CUDA graphs of the compiled model
    sample_attn_kernel: str | None = None  # sampling: pin an SDPA kernel ("flash", "cudnn", "efficient")
    sample_int8: bool = False  # sampling on the CPU: int8 linears (dit_core.sample.int8.int8_copy; opt-in)


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
    return replace(base, grad_accum=spec.grad_accum, precision=precision, ema_every=rung.ema_every)


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


# ----------------------------------------------------------------------------------------------------------
# The ladder sized for a card
# ----------------------------------------------------------------------------------------------------------


def rung_setup(spec: BenchSpec, rung: Rung, device_type: str = "cuda", precision: str | None = None,
               vae: VaeShape | None = None) -> TrainSetup:
    """The memory planner's description of ``rung``'s step on ``spec`` (before anything is built).

    ``precision``: the autocast dtype of the amp rungs (default: the spec's, bf16 for "auto"; fp16 costs the
    same memory). The official step zeroes the gradients between forward and backward, so the last step's
    gradients are alive during the forward pass: counted as accumulation of two micro-batches.
    """
    spec = resolve_spec(spec)
    shape = model_shape(spec)
    if precision is None:
        precision = spec.precision if spec.precision in ("bf16", "fp16") else "bf16"
    ckpt = rung.checkpointing
    blocks = shape.depth if ckpt is True else 0 if ckpt is False else min(int(ckpt), shape.depth)
    accum = max(2, spec.grad_accum) if rung.official else spec.grad_accum
    amp = precision if rung.amp else "fp32"
    return TrainSetup(micro_batch=spec.batch_size, grad_accum=accum, checkpointed=blocks, precision=amp,
                      attn="sdpa" if rung.fused_attention else "math", optimizer="adamw", ema="device",
                      vae_in_loop=not (rung.latents or spec.pixel), vae_precision=amp, vae=vae,
                      device="cuda" if device_type == "cuda" else "cpu")


#: The models the ladder falls back to, largest first, when the card leaves no room for the one asked for.
SIZE_MODELS = ("DiT-XL/2", "DiT-L/2", "DiT-B/2", "DiT-S/2")


@dataclass
class LadderPlan:
    """What runs where: the workload sized for a card, and each rung's predicted peak against the card's budget."""

    spec: BenchSpec  # the workload as sized (model and micro-batch)
    card_gib: float | None  # None: no card limit (the CPU)
    budget: int | None  # bytes a step may use (memory.card_budget), None without a card limit
    reference: str  # the rung every speed-up is a ratio to
    rows: list[dict]  # per rung: rung, label, planned_peak (bytes), fits
    notes: list[str]

    def to_run(self) -> list[str]:
        return [r["rung"] for r in self.rows if r["fits"]]

    def skipped(self) -> list[dict]:
        return [r for r in self.rows if not r["fits"]]

    def skip_status(self, row: dict) -> str:
        return (f"skipped: needs ~{row['planned_peak'] / memory.GIB:.1f} GiB, the {self.card_gib:g} GiB card "
                f"allows {self.budget / memory.GIB:.1f} GiB")

    def table(self) -> str:
        lines = list(self.notes)
        lines.append(f"{'rung':<44}{'planned peak':>14}  runs?")
        for r in self.rows:
            lines.append(f"{r['label']:<44}{r['planned_peak'] / memory.GIB:>12.2f} G  "
                         + ("yes" if r["fits"] else "no (does not fit)"))
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return dict(model=self.spec.model, batch_size=self.spec.batch_size, card_gib=self.card_gib,
                    budget=self.budget, reference=self.reference, rows=self.rows, notes=self.notes)


def _candidate_models(spec: BenchSpec) -> list[str]:
    """The model asked for, then the smaller named ones (only for a named DiT: a profile or a custom shape
    keeps its model and only its batch is sized)."""
    if spec.model in SIZE_MODELS and not spec.pixel:
        return list(SIZE_MODELS[SIZE_MODELS.index(spec.model):])
    return [spec.model]


def _batches(batch: int) -> list[int]:
    out = []
    while batch >= 1:
        out.append(batch)
        batch //= 2
    return out


def plan_ladder(spec: BenchSpec, rungs: list, card_gib: float | None, device_type: str = "cuda",
                min_batch: int = 8, margin: float = 0.10, reserved_gib: float = 0.75,
                vae: VaeShape | None = None) -> LadderPlan:
    """Size the ladder for a card of ``card_gib`` GiB: the model and micro-batch, and which rungs fit.

    The reference (the official step when it is in ``rungs``, else the first rung) must run, since every ratio
    is taken against it: the workload keeps the model asked for and the largest micro-batch (halving from the
    spec's) at which the planner fits the reference in the card's budget (:func:`memory.card_budget`), as long
    as that batch is at least ``min_batch``; otherwise the next smaller model of :data:`SIZE_MODELS` is tried;
    when no model fits at ``min_batch``, the largest model that fits at any batch. Each rung is then predicted
    at that size and runs only if it fits. ``card_gib=None`` (a CPU): nothing is sized and every rung runs.
    """
    spec = resolve_spec(spec)
    rungs = [as_rung(r) for r in rungs]
    if not rungs:
        raise ValueError("plan_ladder needs at least one rung")
    keys = [r.key for r in rungs]
    reference = "official" if "official" in keys else keys[0]
    ref_rung = rungs[keys.index(reference)]

    def peak(s: BenchSpec, rung: Rung) -> int:
        return memory.estimate(model_shape(s), rung_setup(s, rung, device_type, vae=vae)).peak

    notes = []
    budget = None
    if card_gib is None:
        notes.append(f"no card limit ({device_type}): every rung runs, {spec.model} at batch {spec.batch_size}")
    else:
        budget = memory.card_budget(card_gib, margin, reserved_gib)
        asked = (spec.model, spec.batch_size)
        sized = None
        for floor in (min(min_batch, spec.batch_size), 1):
            for name in _candidate_models(spec):
                s = spec if name == spec.model else resolve_spec(replace(spec, model=name, shape={}))
                for b in _batches(spec.batch_size):
                    if b < floor:
                        break
                    trial = replace(s, batch_size=b)
                    if peak(trial, ref_rung) <= budget:
                        sized = trial
                        break
                if sized:
                    break
            if sized:
                break
        head = f"card: {card_gib:g} GiB, budget {budget / memory.GIB:.2f} GiB for a step ({margin:.0%} margin, " \
               f"{reserved_gib:g} GiB for the CUDA context)"
        notes.append(head)
        if sized is None:
            notes.append(f"the reference ({ref_rung.label}) does not fit even at batch 1 of "
                         f"{_candidate_models(spec)[-1]}: no ratio to it can be measured on this card")
        else:
            spec = sized
            if (spec.model, spec.batch_size) != asked:
                notes.append(f"sized: {spec.model} at batch {spec.batch_size} (asked for {asked[0]} at batch "
                             f"{asked[1]}), the largest at which the reference, {ref_rung.label}, fits")
            else:
                notes.append(f"{spec.model} at batch {spec.batch_size}: the reference fits as asked")
    rows = []
    for rung in rungs:
        p = peak(spec, rung)
        rows.append(dict(rung=rung.key, label=rung.label, planned_peak=p, fits=budget is None or p <= budget))
    plan = LadderPlan(spec, card_gib, budget, reference, rows, notes)
    if budget is not None:
        skipped = [r["rung"] for r in plan.skipped()]
        notes.append(f"runs {len(rows) - len(skipped)} of {len(rows)} rungs"
                     + (f"; skipped (predicted not to fit): {', '.join(skipped)}" if skipped else ""))
    return plan

