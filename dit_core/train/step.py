"""One optimizer step of DiT training: the step ``dit-train`` runs and the step ``dit-bench`` times.

:class:`TrainStep` holds what lives across steps (the model, its EMA, AdamW, the fp16 gradient scaler, the
diffusion, the NaN guard) and, called with a step number and the micro-batches, runs the step:

1. draw the step's random numbers for the whole global batch from ``(seed, step)``: timesteps, noise and
   label drops (:func:`dit_core.train.batches.step_draws`);
2. for each of the ``grad_accum`` micro-batches: with the VAE in the loop, encode the images into one
   posterior draw of their latents; drop labels to the null class (classifier-free guidance); compute the
   hybrid loss (``diffusion.training_losses``: MSE on the noise + the variational bound for the variance)
   with the model under autocast; backpropagate ``loss / grad_accum`` (through the scaler in fp16). Gradients
   add up, so ``grad_accum`` micro-batches of ``m`` give the gradient of one batch of ``grad_accum * m``;
3. unscale (fp16), clip the gradient norm, and check loss and norm for NaN/Inf; apply the AdamW step and
   update the EMA, or skip the step. With PyTorch's fused AdamW (the default on GPUs and CPUs) the skip happens
   on the device: the guard's verdict is a tensor, passed to the fused kernel as ``found_inf`` (as the fp16
   gradient scaler does) and used as a mask by the EMA update, so a step needs no host-device
   synchronisation (:mod:`dit_core.train.guard` says when the loop reads it). Other optimizers (8-bit AdamW,
   non-fused AdamW) read the verdict each step.

How it runs is plain data (:class:`StepOptions`): the trainer's defaults, or the official ``train.py``'s
step (:meth:`StepOptions.official`), which the benchmark ladder uses as its reference. With an ``objective``
(:class:`dit_core.train.objectives.Objective`: the flow objective, other timestep sampling, min-SNR weighting,
masked training, representation alignment) step 2 computes that loss instead of DiT's.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from ..runtime import autocast, compile_dit, compiler_missing, default_compile_scope
from ..vae import sample_latents
from . import distributed
from .batches import micro_slice, step_draws
from .ema import EmaUpdater
from .guard import NanGuard


@dataclass(frozen=True)
class StepOptions:
    """How a training step runs. The defaults are the trainer's."""

    grad_accum: int = 1  # micro-batches per optimizer step
    precision: str = "fp32"  # autocast of the model (and of the VAE encoder in the loop): fp32, bf16, fp16
    grad_clip: float = 0.0  # clip the global gradient norm to this (0: no clipping)
    guard: bool = True  # skip (and count) steps whose loss or gradient norm is not finite
    max_bad_steps: int = 5  # the guard stops the run after this many bad steps in a row
    # "end": gradients are freed (set to None) after the update, so none are alive during the next forward.
    # "before_backward": the official train.py's order, zero_grad between forward and backward, so the last
    # step's gradients are alive during the forward pass.
    zero_grad: str = "end"
    ema_decay: float = 0.9999
    ema_warmup: bool = False
    ema_every: int = 1  # update the EMA every N optimizer steps, with the decay raised to N

    def __post_init__(self):
        if self.zero_grad not in ("end", "before_backward"):
            raise ValueError(f"zero_grad must be 'end' or 'before_backward', got {self.zero_grad!r}")
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        if self.ema_every < 1:
            raise ValueError(f"ema_every must be >= 1, got {self.ema_every}")

    @classmethod
    def official(cls, **overrides) -> "StepOptions":
        """The step of the official ``train.py``: fp32, no clipping, no guard, ``zero_grad`` after the forward
        pass, EMA 0.9999 from the first step."""
        return cls(**{**dict(guard=False, grad_clip=0.0, zero_grad="before_backward"), **overrides})


@dataclass
class StepResult:
    """What one step did. Tensors stay on the device; :meth:`values` reads the two numbers the log needs."""

    loss: torch.Tensor  # the mean loss over the global batch (all micro-batches and processes)
    grad_norm: torch.Tensor | None  # the gradient norm before clipping; None when neither clipped nor guarded
    terms: dict = field(default_factory=dict)  # the loss terms ("mse", "vb"), averaged over the micro-batches
    skipped: str | None = None  # the guard's report when it read the verdict and skipped (None: applied or
    # not known yet: with the verdict on the device, the loop reads it later)
    _values: tuple | None = None

    def values(self) -> tuple[float, float]:
        """``(loss, grad_norm)`` as Python floats (one wait for the device, done once)."""
        if self._values is None:
            norm = self.grad_norm if self.grad_norm is not None else torch.full_like(self.loss, math.nan)
            self._values = tuple(float(v) for v in torch.stack([self.loss.float(), norm.float()]).tolist())
        return self._values


def compile_blocks(model: torch.nn.Module, trained: torch.nn.Module | None = None) -> torch.nn.Module:
    """``torch.compile`` for training, in place (:func:`dit_core.runtime.compile_dit` at its default scope): on a
    GPU each block of ``model`` (regional compilation: the blocks share one compiled graph, so it compiles once,
    in seconds rather than minutes, and works with checkpointing and DDP); on the CPU the whole of ``trained``,
    the module whose forward pass the step runs (default: ``model``), whose gradients are correct where a block
    compiled alone is not (:func:`dit_core.runtime.default_compile_scope`). With the options of
    :mod:`dit_core.train.objectives` that is the objective's :class:`~dit_core.alignment.TrainingModel`: the DiT's
    forward and REPA's projector then compile as one graph."""
    trained = model if trained is None else trained
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    if trained is model or default_compile_scope(device) == "blocks":
        return compile_dit(model)
    missing = compiler_missing(device)
    if missing:
        raise ValueError(missing)
    trained.compile()
    return model


def skips_on_device(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt.step()`` can skip its update from a flag on the device: PyTorch's fused Adam and AdamW read
    ``opt.found_inf`` (the hook the fp16 gradient scaler uses) and leave weights, moments and step counts as
    they were when it is 1."""
    return bool(getattr(opt, "_step_supports_amp_scaling", False)) and isinstance(opt, (torch.optim.Adam, torch.optim.AdamW))


def gradient_norm(params: list[torch.Tensor], clip: float) -> torch.Tensor:
    """The global gradient norm (a device tensor), clipping the gradients to ``clip`` when it is > 0."""
    if clip > 0:
        return torch.nn.utils.clip_grad_norm_(params, clip)
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6: no rescaling pass
    if get_total_norm is None:
        return torch.nn.utils.clip_grad_norm_(params, math.inf)
    return get_total_norm([p.grad for p in params if p.grad is not None])


class TrainStep:
    """One optimizer step of DiT training; call it once per step (see the module docstring).

    ``model`` is the DiT (whose parameters AdamW updates and the EMA follows); ``train_model`` what runs the
    forward pass (``model``, or DistributedDataParallel around it). ``batch_size`` is the global batch, whose
    random numbers every process draws from ``(seed, step)`` before taking its slice. With a ``vae`` the
    micro-batches hold images, encoded in the loop; otherwise they hold what the model sees (pixels or latents).
    """

    def __init__(self, model, diffusion, opt, ema, options: StepOptions, *, batch_size: int, seed: int = 0,
                 procs: distributed.Processes | None = None, train_model=None, vae=None, objective=None):
        self.model, self.diffusion, self.opt, self.ema, self.options = model, diffusion, opt, ema, options
        self.train_model = train_model if train_model is not None else model
        self.device = next(model.parameters()).device
        self.procs = procs or distributed.Processes(0, 1, 0, self.device)
        self.batch_size, self.seed, self.vae = batch_size, seed, vae
        if batch_size % (options.grad_accum * self.procs.world_size):
            raise ValueError(f"batch_size {batch_size} must be a multiple of grad_accum x processes = "
                             f"{options.grad_accum} x {self.procs.world_size}")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.objective = objective  # None: DiT's loss; else its loss, and its training-only parameters
        if objective is not None:
            self.params += [p for p in objective.heads.parameters() if p.requires_grad]
        self.scaler = torch.amp.GradScaler(self.device.type) if options.precision == "fp16" else None
        lr = opt.defaults.get("lr", float("nan"))
        self.guard = NanGuard(options.max_bad_steps, lr, options.precision, options.grad_clip,
                              self.device) if options.guard else None
        self.skips_on_device = skips_on_device(opt)
        self.sample_shape = (model.in_channels, model.input_size, model.input_size)
        self.num_classes = model.num_classes
        self.dropout = model.class_dropout_prob if model.num_classes else 0.0
        self.ema_update = EmaUpdater(ema, model, options.ema_decay, options.ema_warmup, options.ema_every)

    @property
    def ema_updates(self) -> int:
        """EMA updates applied so far (reads the device; for checkpoints)."""
        return self.ema_update.state()

    @ema_updates.setter
    def ema_updates(self, value: int) -> None:
        self.ema_update.load(value)

    def forward(self, x, t, y=None):
        """The model under autocast; its output in fp32, so that the loss is computed in fp32."""
        with autocast(self.device, self.options.precision):
            return self.train_model(x, t, y).float()

    def _backward(self, loss):
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def __call__(self, step: int, micro_batches) -> StepResult:
        """Run optimizer step ``step`` (counted from 0) on the next ``grad_accum`` items ``(x, y)`` of
        ``micro_batches`` (an iterator)."""
        o, dev, procs = self.options, self.device, self.procs
        draws = step_draws(self.seed, step, self.batch_size, self.sample_shape, self.diffusion.num_timesteps,
                           self.dropout)
        loss_sum = torch.zeros((), device=dev)
        names = ("mse", "vb") if self.objective is None else self.objective.term_names
        terms = {name: torch.zeros((), device=dev) for name in names}
        bad_inputs = torch.zeros((), dtype=torch.bool, device=dev)
        for micro in range(o.grad_accum):
            x, y, *extra = next(micro_batches)  # extra: what an objective's data brings (teacher features)
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            if self.vae is not None:
                x = sample_latents(self.vae, x, o.precision)
            d_slice = micro_slice(self.batch_size, o.grad_accum, procs.world_size, procs.rank, micro)
            d = draws.slice(d_slice)
            t, noise = d.t.to(dev, non_blocking=True), d.noise.to(dev, non_blocking=True)
            if self.num_classes:  # label dropout: the null class teaches the unconditional model for guidance
                y = torch.where(d.drop.to(dev, non_blocking=True), torch.full_like(y, self.num_classes), y)
            last = micro == o.grad_accum - 1
            sync = self.train_model.no_sync() if procs.distributed and not last else contextlib.nullcontext()
            with sync:
                if self.objective is None:
                    out = self.diffusion.training_losses(self.forward, x, t, model_kwargs=dict(y=y), noise=noise)
                else:
                    out = self.objective.losses(self, step, d_slice, x, y, t, noise, extra)
                loss = out["loss"].mean()
                if o.zero_grad == "before_backward" and micro == 0:
                    self.opt.zero_grad(set_to_none=True)
                self._backward(loss / o.grad_accum)
            loss_sum += loss.detach()
            for key in terms:
                if key in out:
                    terms[key] += out[key].detach().float().mean()
            bad_inputs |= ~torch.isfinite(x).all()
        result = StepResult(loss=distributed.mean_over_processes(loss_sum / o.grad_accum, procs), grad_norm=None,
                            terms={k: v / o.grad_accum for k, v in terms.items()})
        # check, clip, update
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        if self.guard is not None or o.grad_clip > 0:
            result.grad_norm = gradient_norm(self.params, o.grad_clip)
        if self.guard is None:  # the official step: no check
            self.scaler.step(self.opt) if self.scaler is not None else self.opt.step()
            self.ema_update(step)
        else:
            scale = getattr(self.scaler, "_scale", None) if self.scaler is not None else None
            ok = self.guard.check(step, result.loss, result.grad_norm, bad_inputs, scale)
            if self.skips_on_device:
                self._step_unless(~ok)
                self.ema_update(step, ok)
            else:  # the optimizer cannot skip by itself: read the verdict (waits for the device)
                self.guard.read()
                if self.guard.last_ok:
                    self.opt.step()
                    self.ema_update(step)
                else:
                    result.skipped = self.guard.pending[-1]
        if self.scaler is not None:
            self.scaler.update()  # lowers the loss scale after an overflow (found by unscale_)
        if o.zero_grad == "end":
            self.opt.zero_grad(set_to_none=True)
        return result

    def _step_unless(self, found_inf: torch.Tensor) -> None:
        """The fused AdamW step, which leaves everything as it was where ``found_inf`` is true (on the device)."""
        self.opt.found_inf, self.opt.grad_scale = found_inf.float(), None
        try:
            self.opt.step()
        finally:
            del self.opt.found_inf, self.opt.grad_scale
