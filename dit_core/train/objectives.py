"""Training objectives that converge faster than DiT's, as options of the same training step.

Each option is off by default; with all of them off the step runs DiT's own loss
(``diffusion.training_losses``) and nothing here is called. With any of them on,
:class:`~dit_core.train.step.TrainStep` calls :meth:`Objective.losses` instead, which composes:

1. **the objective** (``objective: flow``; SiT, Ma et al. 2024): the linear interpolant
   ``x_t = (1 - t) x_0 + t eps`` with the velocity ``v = eps - x_0`` as target (:mod:`dit_core.diffusion.flow`
   has the convention and the samplers). ``ddpm`` is DiT's: noise prediction, learned variance, hybrid loss.
2. **timestep sampling** (``timestep_sampling: logit_normal``; Esser et al. 2024, "SD3"): ``t = sigmoid(n)``,
   ``n ~ N(logit_mean, logit_std)`` (SD3's best: 0 and 1), which spends the training on the middle times and
   few on the nearly clean and the nearly pure-noise ends. For ``ddpm`` the draw ``u`` in (0, 1) becomes the
   step ``floor(u T)``; a uniform ``u`` would give DiT's uniform steps exactly.
3. **loss weighting** (``loss_weighting: min_snr``; Hang et al. 2023): every example's denoising MSE is
   weighted so that, measured as an error on ``x_0``, its weight is ``min(SNR_t, gamma)`` (gamma = 5): the
   easy, nearly clean times stop dominating the gradient. For noise prediction the ``x_0``-error is the noise
   error times ``1/SNR``, so the weight on the noise MSE is ``min(SNR, gamma) / SNR``. For the interpolant's
   velocity, ``x_0 = x_t - t v`` makes the ``x_0``-error ``t^2`` times the velocity error, and
   ``1/t^2 = (sqrt(SNR) + 1)^2`` with ``SNR = ((1 - t)/t)^2``, so the weight is ``min(SNR, gamma) / (sqrt(SNR) +
   1)^2``. (The familiar ``min(SNR, gamma) / (SNR + 1)`` is the same rule for the *variance-preserving* path's
   velocity; the linear interpolant does not preserve variance.) The learned-variance term is not weighted.
4. **masked training** (``mask_ratio``; MaskDiT, Zheng et al. 2024): the encoder blocks see only a random
   ``1 - mask_ratio`` of the tokens, the last ``mask_decoder_depth`` blocks see them all again, with a mask token
   at the dropped positions (:meth:`dit_core.models.DiT.forward`, :mod:`dit_core.alignment`). The denoising loss counts the kept tokens only; the
   dropped ones are trained to reconstruct the model's noisy input ``x_t`` (MaskDiT's MAE loss: each patch
   normalised to zero mean and unit variance, weight ``mae_weight`` = 0.1). The last ``mask_finetune_steps``
   steps train unmasked, as MaskDiT ends with unmasked fine-tuning.
5. **representation alignment** (``repa_weight``; REPA, Yu et al. 2024): the tokens after block
   ``repa_depth``, through a projector MLP, are pulled towards a pretrained teacher's features of the *clean*
   image by a negative cosine similarity per token, averaged over the tokens: ``loss += repa_weight *
   mean_tokens(-cos(proj(h_k), f))`` (REPA: weight 0.5, DINOv2 ViT-B/14 patch tokens; :mod:`dit_core.teachers`).

**Random numbers.** The noise, the label drops and, for ``ddpm`` with uniform steps, the timesteps are the
step's own draws (:func:`dit_core.train.batches.step_draws`), so a method and the baseline with the same seed
see the same noise and labels. The continuous times and the masks are drawn here, for the whole global batch,
from ``(seed, step)`` on a stream of their own: a resumed run, any number of processes and any accumulation
see the same numbers, as in the rest of the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from ..alignment import TrainingHeads, TrainingModel, gather_tokens, patchify
from ..diffusion.losses import mean_flat
from ..runtime import autocast
from .batches import generator

#: The random stream of this module's draws (dit_core.train.batches uses 1, 2 and 3).
STREAM_OBJECTIVE = 4


@dataclass(frozen=True)
class ObjectiveOptions:
    """The options of this module, as in :class:`~dit_core.train.config.TrainConfig` (same names and defaults);
    ``max_steps`` places the unmasked fine-tuning at the end of the run."""

    objective: str = "ddpm"
    timestep_sampling: str = "uniform"
    logit_mean: float = 0.0
    logit_std: float = 1.0
    loss_weighting: str = "none"
    min_snr_gamma: float = 5.0
    mask_ratio: float = 0.0
    mask_decoder_depth: int = 1
    mae_weight: float = 0.1
    mask_finetune_steps: int = 0
    repa_weight: float = 0.0
    repa_depth: int = 8
    max_steps: int = 0

    @classmethod
    def from_config(cls, cfg) -> "ObjectiveOptions":
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})

    @property
    def active(self) -> bool:
        """Whether any option leaves DiT's recipe (then the step runs :meth:`Objective.losses`)."""
        return (self.objective != "ddpm" or self.timestep_sampling != "uniform" or self.loss_weighting != "none"
                or self.mask_ratio > 0 or self.repa_weight > 0)


# ----------------------------------------------------------------------------------------------------------
# The pieces, each a small function
# ----------------------------------------------------------------------------------------------------------


@dataclass
class ObjectiveDraws:
    """This module's random numbers for a global batch: ``u`` (B,) in (0, 1), the time before any mapping, and
    ``keep`` (B, K), the token positions the encoder sees (None without masking)."""

    u: torch.Tensor
    keep: torch.Tensor | None


def kept_tokens(num_tokens: int, mask_ratio: float) -> int:
    """How many of ``num_tokens`` the encoder keeps: ``round((1 - mask_ratio) T)``, at least 1."""
    return max(1, int(round(num_tokens * (1.0 - mask_ratio))))


def objective_draws(seed: int, step: int, batch_size: int, num_tokens: int, options: ObjectiveOptions,
                    masked: bool = True) -> ObjectiveDraws:
    """Draw the times (uniform, or logit-normal ``sigmoid(N(m, s))``) and, when ``masked``, a random subset of
    ``kept_tokens`` positions per example (sorted), for step ``step`` of the global batch."""
    g = generator(seed, STREAM_OBJECTIVE, step)
    if options.timestep_sampling == "logit_normal":
        u = torch.sigmoid(options.logit_mean + options.logit_std * torch.randn(batch_size, generator=g))
    else:
        u = torch.rand(batch_size, generator=g)
    keep = None
    if masked and options.mask_ratio > 0:
        scores = torch.rand(batch_size, num_tokens, generator=g)
        keep = scores.argsort(dim=1)[:, : kept_tokens(num_tokens, options.mask_ratio)].sort(dim=1).values
    return ObjectiveDraws(u, keep)


def ddpm_steps(u: torch.Tensor, num_timesteps: int) -> torch.Tensor:
    """Continuous draws ``u`` in (0, 1) as DDPM steps ``floor(u T)`` (0 .. T-1)."""
    return (u * num_timesteps).long().clamp(0, num_timesteps - 1)


def ddpm_snr(diffusion, steps: torch.Tensor) -> torch.Tensor:
    """``SNR_t = alpha_bar_t / (1 - alpha_bar_t)`` of a Gaussian diffusion at integer ``steps``."""
    abar = torch.as_tensor(diffusion.alphas_cumprod, dtype=torch.float64)[steps.cpu()].to(steps.device)
    return (abar / (1 - abar)).float()


def min_snr_weight(snr: torch.Tensor, gamma: float, prediction: str) -> torch.Tensor:
    """Min-SNR-gamma weight on the MSE of ``prediction`` "eps" (``min(SNR, g) / SNR``) or "velocity" of the
    linear interpolant (``min(SNR, g) / (sqrt(SNR) + 1)^2``); see the module docstring."""
    clipped = torch.clamp(snr, max=gamma)
    if prediction == "eps":
        return clipped / snr
    if prediction == "velocity":
        return clipped / (snr.sqrt() + 1) ** 2
    raise ValueError(f"prediction must be 'eps' or 'velocity', got {prediction!r}")


def token_mean(values: torch.Tensor, patch_size: int, weights: torch.Tensor | None) -> torch.Tensor:
    """Per-example mean of an elementwise map ``(N, C, H, W)``: over everything (``weights`` None), or over the
    tokens with weight 1 in ``weights`` (N, T)."""
    if weights is None:
        return mean_flat(values)
    per_token = patchify(values, patch_size).mean(dim=-1)
    return (per_token * weights).sum(dim=1) / weights.sum(dim=1)


def mae_loss(prediction: torch.Tensor, target: torch.Tensor, patch_size: int, masked: torch.Tensor) -> torch.Tensor:
    """MaskDiT's reconstruction loss: the MSE between predicted patches and target patches, each target patch
    normalised to zero mean and unit variance, averaged over the ``masked`` tokens (N, T) of each example."""
    target = patchify(target, patch_size)
    target = (target - target.mean(dim=-1, keepdim=True)) / (target.var(dim=-1, keepdim=True) + 1e-6).sqrt()
    per_token = (patchify(prediction, patch_size) - target).square().mean(dim=-1)
    return (per_token * masked).sum(dim=1) / masked.sum(dim=1)


def alignment_loss(projected: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """REPA's loss: minus the cosine similarity of each projected token ``(N, T, D)`` with the teacher's token,
    averaged over the tokens; shape (N,). It lies in [-1, 1]; -1 is perfect alignment (so a run's total loss
    goes below 0 as the alignment improves)."""
    return -(F.normalize(projected, dim=-1) * F.normalize(target, dim=-1)).sum(dim=-1).mean(dim=-1)


# ----------------------------------------------------------------------------------------------------------
# The objective the step calls
# ----------------------------------------------------------------------------------------------------------


class Objective:
    """The training loss under the options (see the module docstring), and the training-only parameters.

    ``process``: the diffusion or the interpolant (:func:`dit_core.diffusion.create_process`); ``model``: the
    DiT. ``teacher``: for alignment, a function from clean inputs ``(N, C, H, W)`` to token features
    ``(N, T, D)``, or None when the features come with each micro-batch (pre-extracted, beside latents);
    ``teacher_dim``: ``D``. ``module`` (:class:`~dit_core.alignment.TrainingModel`) is what the optimizer
    updates and DDP wraps; ``heads`` its training-only part (saved in checkpoints as ``extras``).
    """

    def __init__(self, options: ObjectiveOptions, process, model, *, seed: int = 0, batch_size: int = 1,
                 teacher=None, teacher_dim: int = 0, projector_dim: int = 2048):
        if not options.active:
            raise ValueError("no option is on: use DiT's loss (TrainStep without an objective)")
        if options.objective == "flow" and not getattr(process, "is_interpolant", False):
            raise ValueError("objective 'flow' needs the linear interpolant (create_process('flow'))")
        if options.mask_ratio > 0 and not 1 <= options.mask_decoder_depth < model.depth:
            raise ValueError(f"mask_decoder_depth must be in 1..{model.depth - 1} for this {model.depth}-block "
                             f"DiT, got {options.mask_decoder_depth}")
        if options.repa_weight > 0:
            if not 1 <= options.repa_depth <= model.depth:
                raise ValueError(f"repa_depth must be in 1..{model.depth} for this {model.depth}-block DiT, got "
                                 f"{options.repa_depth}")
            if teacher_dim < 1:
                raise ValueError("representation alignment needs a teacher (teacher_dim >= 1)")
        self.options, self.process, self.seed, self.batch_size = options, process, seed, batch_size
        self.flow = options.objective == "flow"
        self.teacher = teacher
        self.patch_size = model.patch_size
        self.num_tokens = model.x_embedder.num_patches
        self.heads = TrainingHeads(model.hidden_size, projector_dim=projector_dim if options.repa_weight > 0 else 0,
                                   teacher_dim=teacher_dim if options.repa_weight > 0 else 0,
                                   mask=options.mask_ratio > 0)
        self.heads.to(next(model.parameters()).device)
        self.module = TrainingModel(model, self.heads, options.mask_decoder_depth if options.mask_ratio > 0 else 0)
        self._draws = (None, None)

    @property
    def extras(self):
        """The training-only parameters to checkpoint (:attr:`heads`), or None when there are none."""
        return self.heads if any(True for _ in self.heads.parameters()) else None

    @property
    def term_names(self) -> tuple[str, ...]:
        """The loss terms :meth:`losses` reports beside ``loss``."""
        names = ["mse"] + ([] if self.flow else ["vb"])
        return tuple(names + (["mae"] if self.options.mask_ratio > 0 else [])
                     + (["repa"] if self.options.repa_weight > 0 else []))

    def masked_at(self, step: int) -> bool:
        """Whether step ``step`` trains masked (not during the final unmasked fine-tuning)."""
        o = self.options
        return o.mask_ratio > 0 and step < o.max_steps - o.mask_finetune_steps

    def draws(self, step: int) -> ObjectiveDraws:
        """This step's :func:`objective_draws` for the global batch (computed once per step)."""
        if self._draws[0] != step:
            self._draws = (step, objective_draws(self.seed, step, self.batch_size, self.num_tokens, self.options,
                                                 masked=self.masked_at(step)))
        return self._draws[1]

    def losses(self, trainer, step: int, batch_slice: slice, x_start, y, steps, noise, extra=()) -> dict:
        """Per-example loss terms (N,) for one micro-batch: ``loss`` and :attr:`term_names`.

        ``trainer``: the :class:`~dit_core.train.step.TrainStep` (its ``train_model`` runs :attr:`module`, DDP
        or not, under its autocast); ``batch_slice``: this micro-batch's slots in the global batch; ``steps``
        and ``noise``: the step's own draws; ``extra``: what the micro-batch carries after ``(x, y)`` (the
        teacher's features of pre-extracted data).
        """
        o, dev = self.options, x_start.device
        d = self.draws(step)
        u = d.u[batch_slice].to(dev)
        if not self.flow and o.timestep_sampling != "uniform":
            steps = ddpm_steps(u, self.process.num_timesteps)
        keep = d.keep[batch_slice].to(dev) if d.keep is not None else None
        weights = None
        if keep is not None:
            weights = torch.zeros(len(keep), self.num_tokens, device=dev).scatter_(1, keep, 1.0)
        capture = o.repa_depth if o.repa_weight > 0 else None
        seen = {}  # what the process's loss does not return: the model's input and output, the projected tokens

        def model_fn(x_t, t, y):
            with autocast(trainer.device, trainer.options.precision):
                output, seen["projected"] = trainer.train_model(x_t, t, y, keep=keep, capture=capture)
            seen["x_t"], seen["output"] = x_t, output.float()
            return seen["output"]

        # the process's own loss (DiT's hybrid loss, or the interpolant's velocity MSE), over the kept tokens
        terms = self.process.training_losses(model_fn, x_start, u if self.flow else steps, dict(y=y), noise=noise,
                                             reduce=lambda m: token_mean(m, self.patch_size, weights))
        terms.pop("loss")
        mse = terms["mse"]
        if o.loss_weighting == "min_snr":
            snr = self.process.snr(u) if self.flow else ddpm_snr(self.process, steps)
            mse = mse * min_snr_weight(snr, o.min_snr_gamma, "velocity" if self.flow else "eps")
        loss = mse + terms.get("vb", 0.0)
        if keep is not None:
            prediction = seen["output"][:, : x_start.shape[1]]
            terms["mae"] = mae_loss(prediction, seen["x_t"], self.patch_size, 1.0 - weights)
            loss = loss + o.mae_weight * terms["mae"]
        elif o.mask_ratio > 0 and trainer.procs.distributed:  # unmasked fine-tuning: DDP wants every parameter used
            loss = loss + 0.0 * self.heads.mask_token.sum()
        if seen["projected"] is not None:
            features = extra[0].to(dev).float() if extra else self.teacher(x_start)
            if seen["projected"].shape[1] != features.shape[1]:  # aligned at an encoder block: the kept tokens only
                features = gather_tokens(features, keep)
            terms["repa"] = alignment_loss(seen["projected"].float(), features)
            loss = loss + o.repa_weight * terms["repa"]
        terms["loss"] = loss
        return terms


# ----------------------------------------------------------------------------------------------------------
# From a training config
# ----------------------------------------------------------------------------------------------------------


def build_objective(cfg, model, process, dataset, out: Path, procs, device):
    """``(objective, dataset)`` for a training config: the :class:`Objective`, or None when every option is off
    (DiT's recipe); and the dataset, whose latents come with their teacher features under latent alignment
    (:class:`~dit_core.latents.features.TeacherFeatureDataset`)."""
    options = ObjectiveOptions.from_config(cfg)
    if not options.active:
        return None, dataset
    teacher, teacher_dim = None, 0
    if options.repa_weight > 0:
        subset = dataset if isinstance(dataset, torch.utils.data.Subset) else None
        base = subset.dataset if subset is not None else dataset
        if hasattr(base, "latent_shape"):  # pre-extracted features come with each item
            from ..latents.features import TeacherFeatureDataset, teacher_folder

            base = TeacherFeatureDataset(base, teacher_folder(base.path, cfg.repa_teacher), model.x_embedder.grid_size)
            dataset = torch.utils.data.Subset(base, subset.indices) if subset is not None else base
            teacher_dim = base.teacher_dim
        else:
            from ..teachers import run_teacher

            teacher, teacher_dim = run_teacher(cfg, dataset, out, procs, device, model.x_embedder.grid_size)
    objective = Objective(options, process, model, seed=cfg.seed, batch_size=cfg.batch_size, teacher=teacher,
                          teacher_dim=teacher_dim, projector_dim=cfg.repa_projector_dim)
    return objective, dataset
