"""The memory planner: micro-batch, gradient accumulation and checkpointed blocks for a card, and what keeps
DiT-XL/2 trainable on a small one.

:func:`plan` picks the setting that fits a card and is fastest by :func:`relative_step_time`;
:func:`low_memory_options` says what keeps DiT-XL/2 trainable on a 12 GB card and what each option costs in
speed; :func:`fitting_plan` falls back to those options when the setting asked for does not fit;
:func:`train_command` writes a plan as the ``dit-train`` command that runs it, and :func:`config_setup` reads a
``dit-train`` configuration back as the planner's setting. ``dit-plan`` is the command-line front end
(:mod:`dit_core.cli.plan`).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, replace

from .estimator import GIB, MemoryEstimate, ModelShape, TrainSetup, activation_bytes, estimate, param_counts

#: Nominal memory of common cards in GiB (a "24 GB" RTX 3090 has 24 GiB; torch reports a little less).
GPU_MEMORY_GIB = {
    "rtx3060": 12, "rtx4070": 12, "rtx4070ti": 12, "rtx3080": 10, "rtx3080-12gb": 12, "rtx4080": 16,
    "t4": 16, "v100-16gb": 16, "v100-32gb": 32, "rtx3090": 24, "rtx4090": 24, "l4": 24, "a10": 24,
    "a100-40gb": 40, "l40s": 48, "a6000": 48, "a100-80gb": 80, "h100": 80, "h100-80gb": 80, "h200": 141,
}


# ----------------------------------------------------------------------------------------------------------
# The planner
# ----------------------------------------------------------------------------------------------------------

#: Planner assumptions for relative speed (stated, not measured here; `dit-bench` measures the real ratios):
#: a checkpointed block runs its forward twice, and the forward is about 1/3 of a step's arithmetic, so
#: checkpointing k of L blocks costs about k / (3 L) more time; a micro-batch of fewer than this many tokens
#: leaves a large GPU partly idle (time per image grows as tokens drop below it).
SATURATING_TOKENS = 8192
#: Host-side figures for the EMA-on-CPU option (GB/s): effective PCIe copy rate, CPU memory bandwidth.
PCIE_GBPS = 12.0
CPU_MEMORY_GBPS = 10.0


def relative_step_time(shape: ModelShape, setup: TrainSetup, saturating_tokens: int = SATURATING_TOKENS) -> float:
    """Estimated time per image relative to no checkpointing at a saturating micro-batch (1.0)."""
    recompute = setup.checkpointed / (3 * shape.depth)
    utilisation = min(1.0, setup.micro_batch * shape.tokens / saturating_tokens)
    return (1 + recompute) / utilisation


def parse_memory(value) -> float:
    """GPU memory in GiB from a number ("24", 24.0), a card name ("rtx3090") or "24GB"/"24GiB"."""
    if isinstance(value, (int, float)):
        gib = float(value)
    else:
        text = str(value).strip().lower()
        if text in GPU_MEMORY_GIB:
            return float(GPU_MEMORY_GIB[text])
        for suffix in ("gib", "gb", "g"):
            if text.endswith(suffix):
                text = text[: -len(suffix)]
                break
        try:
            gib = float(text)
        except ValueError:
            raise ValueError(
                f"GPU memory {value!r} is neither a number of GiB nor a known card; use e.g. 24, '24GB' or one of "
                f"{', '.join(sorted(GPU_MEMORY_GIB))}"
            ) from None
    if gib <= 0:
        raise ValueError(f"GPU memory must be positive, got {value!r}")
    return gib


@dataclass
class Plan:
    """The planner's choice and the reasons for it."""

    fits: bool
    setup: TrainSetup | None
    estimate: MemoryEstimate | None
    budget: int  # bytes the step may use
    gpu_memory: int
    relative_time: float | None
    explanation: list[str]
    candidates: list[dict]

    def __str__(self) -> str:
        return "\n".join(self.explanation)

    def as_dict(self) -> dict:
        return {"fits": self.fits, "setup": asdict(self.setup) if self.setup else None,
                "estimate": self.estimate.as_dict() if self.estimate else None, "budget": self.budget,
                "gpu_memory": self.gpu_memory, "relative_time": self.relative_time,
                "explanation": self.explanation, "candidates": self.candidates}


def _micro_batches(global_batch: int) -> list[int]:
    """Divisors of the global batch, largest first (so accumulation gives exactly the global batch)."""
    return sorted((m for m in range(1, global_batch + 1) if global_batch % m == 0), reverse=True)


def plan(
    shape: ModelShape,
    gpu_memory,
    global_batch: int = 256,
    precision: str = "bf16",
    attn: str = "sdpa",
    optimizer: str = "adamw",
    ema: str = "device",
    vae_in_loop: bool = False,
    margin: float = 0.10,
    reserved_gib: float = 0.75,
    max_micro_batch: int | None = None,
) -> Plan:
    """Choose micro-batch, accumulation and checkpointed blocks for a card of ``gpu_memory``.

    The budget is ``gpu_memory x (1 - margin) - reserved_gib``: ``reserved_gib`` stands for the CUDA context
    and library workspaces that ``max_memory_allocated`` does not count, ``margin`` for the caching
    allocator's fragmentation. With ``vae_in_loop`` the encoder's tensors are counted but not cuDNN's
    convolution workspace (:func:`~.estimator.vae_encode_bytes`). For every micro-batch that divides ``global_batch`` the planner takes the
    fewest checkpointed blocks that fit, estimates the time per image (:func:`relative_step_time`) and keeps
    the fastest; ties go to the larger micro-batch.
    """
    if global_batch < 1:
        raise ValueError(f"global_batch must be >= 1, got {global_batch}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    total = parse_memory(gpu_memory) * GIB
    budget = card_budget(gpu_memory, margin, reserved_gib)
    base = TrainSetup(precision=precision, attn=attn, optimizer=optimizer, ema=ema, vae_in_loop=vae_in_loop)
    candidates = []
    best = None
    for m in _micro_batches(global_batch):
        if max_micro_batch and m > max_micro_batch:
            continue
        for k in range(shape.depth + 1):
            setup = replace(base, micro_batch=m, grad_accum=global_batch // m, checkpointed=k)
            est = estimate(shape, setup)
            if est.peak <= budget:
                rel = relative_step_time(shape, setup)
                candidates.append(dict(micro_batch=m, grad_accum=global_batch // m, checkpointed=k,
                                       peak_gib=round(est.peak / GIB, 2), relative_time=round(rel, 3)))
                if best is None or rel < best[0] - 1e-9:
                    best = (rel, setup, est)
                break
    first = estimate(shape, replace(base, micro_batch=1, grad_accum=global_batch, checkpointed=shape.depth))
    counts = param_counts(shape)
    act0 = activation_bytes(shape, precision, attn, 0)
    act_all = activation_bytes(shape, precision, attn, shape.depth)
    lines = [
        f"{shape.name}: {counts['total'] / 1e6:.1f} M parameters, {shape.tokens} tokens per sample; "
        f"{precision} {'autocast' if precision != 'fp32' else ''}, {attn} attention, {optimizer}, EMA on {ema}"
        + (", VAE in the loop" if vae_in_loop else ", pre-extracted latents"),
        f"card {total / GIB:.1f} GiB -> budget {budget / GIB:.2f} GiB ({margin:.0%} margin, "
        f"{reserved_gib:g} GiB for the CUDA context and workspaces)",
        f"always there: weights {first.weights / GIB:.2f} + optimizer {first.optimizer / GIB:.2f} + EMA "
        f"{first.ema / GIB:.2f} GiB; gradients {first.grads / GIB:.2f} GiB",
        f"activations per sample: {act0.per_sample / 2**20:.1f} MiB without checkpointing, "
        f"{act_all.per_sample / 2**20:.1f} MiB with every block checkpointed",
    ]
    if vae_in_loop:
        lines.append("VAE in the loop: its weights and tensors are counted, not the convolution workspace cuDNN "
                     "takes, which grows with the free memory (measured on a GPU: chapter 06)")
    if best is None:
        lines.append(
            f"does not fit: even micro-batch 1 with all {shape.depth} blocks checkpointed needs "
            f"{first.peak / GIB:.2f} GiB. Try: {', '.join(_suggestions(optimizer, ema, precision))} "
            "(see low_memory_options / `dit-plan --low-memory`)."
        )
        return Plan(False, None, None, budget, int(total), None, lines, candidates)
    rel, setup, est = best
    lines.append(
        f"choice: micro-batch {setup.micro_batch} x {setup.grad_accum} accumulation step"
        f"{'s' if setup.grad_accum > 1 else ''} = global batch {global_batch}, gradient checkpointing on "
        f"{setup.checkpointed} of {shape.depth} blocks; predicted peak {est.peak / GIB:.2f} GiB "
        f"({est.peak / budget:.0%} of the budget)"
    )
    reasons = []
    if setup.checkpointed:
        reasons.append(f"checkpointing {setup.checkpointed} blocks costs ~{setup.checkpointed / (3 * shape.depth):.0%} "
                       "more compute (one more forward of each)")
    util = min(1.0, setup.micro_batch * shape.tokens / SATURATING_TOKENS)
    if util < 1:
        reasons.append(f"a micro-batch of {setup.micro_batch * shape.tokens} tokens is below the "
                       f"~{SATURATING_TOKENS} that keep a large GPU busy")
    lines.append("why: fastest estimated time per image among the micro-batches that fit"
                 + ("; " + "; ".join(reasons) if reasons else "; no recomputation and a full micro-batch"))
    return Plan(True, setup, est, budget, int(total), rel, lines, candidates)


def _suggestions(optimizer: str, ema: str, precision: str) -> list[str]:
    """What to change, in ``dit-train``'s own keys."""
    out = []
    if ema == "device":
        out.append("--ema-device cpu")
    if optimizer == "adamw":
        out.append("--optimizer adamw8bit")
    if precision == "fp32":
        out.append("--mixed-precision bf16")
    return out or ["a larger card, or a smaller model"]


#: The low-memory fallbacks in the order :func:`fitting_plan` tries them: the EMA on the CPU changes no number
#: of training (only its speed), 8-bit AdamW changes the optimizer's arithmetic a little; then both.
FALLBACKS = (("adamw", "cpu"), ("adamw8bit", "device"), ("adamw8bit", "cpu"))


def fitting_plan(shape: ModelShape, gpu_memory, global_batch: int = 256, precision: str = "bf16",
                 attn: str = "sdpa", optimizer: str = "adamw", ema: str = "device", **kwargs) -> tuple[Plan, bool]:
    """:func:`plan` for the setting asked for; when it does not fit, the first of :data:`FALLBACKS` that does
    (never undoing a saving that was asked for). Returns ``(plan, fallback_used)``."""
    asked = plan(shape, gpu_memory, global_batch, precision, attn, optimizer, ema, **kwargs)
    if asked.fits or ema == "none":
        return asked, False
    for opt, place in FALLBACKS:
        if (optimizer == "adamw8bit" and opt == "adamw") or (ema == "cpu" and place == "device"):
            continue
        p = plan(shape, gpu_memory, global_batch, precision, attn, opt, place, **kwargs)
        if p.fits:
            return p, True
    return asked, False


def train_command(shape: ModelShape, setup: TrainSetup, image_size: int | None = None,
                  profile: str | None = None) -> str | None:
    """The ``dit-train`` command that trains ``shape`` with ``setup`` on one GPU, in the trainer's own keys, or
    None where the trainer has no such setting (the VAE in the loop: it trains on pre-extracted latents; no
    EMA: it always keeps one). ``profile``: a bundled profile the model comes from (e.g. ``digits``)."""
    if setup.vae_in_loop or setup.ema == "none":
        return None
    if profile is not None:
        args = ["--config", profile]
    else:
        size = image_size or shape.input_size * 8
        args = ["--model", shape.name, "--image-size", str(size), "--latents-path", f"data/imagenet{size}-latents"]
    k = setup.checkpointed
    ckpt = "true" if k >= shape.depth else "false" if k == 0 else str(k)
    args += ["--batch-size", str(setup.global_batch), "--grad-accum", str(setup.grad_accum),
             "--grad-checkpointing", ckpt, "--mixed-precision", setup.precision, "--attn-backend", setup.attn,
             "--optimizer", setup.optimizer, "--ema-device", "cpu" if setup.ema == "cpu" else "same"]
    return "dit-train " + shlex.join(args)


def config_setup(cfg, world_size: int = 1) -> tuple[ModelShape, TrainSetup]:
    """The planner's view of a ``dit-train`` configuration (a :class:`dit_core.train.TrainConfig` of a latent
    DiT): the model's shape and the step's setting, to estimate a profile's memory."""
    overrides = {k: getattr(cfg, k) for k in ("depth", "hidden_size", "num_heads", "patch_size")
                 if getattr(cfg, k) is not None}
    shape = ModelShape.from_name(cfg.model, cfg.image_size, learn_sigma=cfg.learn_sigma,
                                 class_dropout_prob=cfg.class_dropout_prob, block=cfg.block, **overrides)
    ckpt = cfg.grad_checkpointing
    checkpointed = shape.depth if ckpt is True else 0 if ckpt is False else min(int(ckpt), shape.depth)
    precision = cfg.mixed_precision if cfg.mixed_precision != "auto" else "bf16"
    setup = TrainSetup(micro_batch=cfg.batch_size // (cfg.grad_accum * world_size), grad_accum=cfg.grad_accum,
                       checkpointed=checkpointed, precision=precision, attn=cfg.attn_backend,
                       optimizer=cfg.optimizer, ema="cpu" if cfg.ema_device == "cpu" else "device")
    return shape, setup


def card_budget(gpu_memory, margin: float = 0.10, reserved_gib: float = 0.75) -> int:
    """Bytes a training step may use on a card, as :func:`plan` counts them."""
    return int(parse_memory(gpu_memory) * GIB * (1 - margin) - reserved_gib * GIB)


def ema_cpu_cost_s(params: int, pcie_gbps: float = PCIE_GBPS, cpu_gbps: float = CPU_MEMORY_GBPS) -> float:
    """Seconds per EMA update kept on the CPU: copy the weights over PCIe, then ``lerp`` on the CPU (read
    EMA and weights, write EMA: 3 x 4 bytes per parameter)."""
    return params * 4 / (pcie_gbps * 1e9) + 3 * params * 4 / (cpu_gbps * 1e9)


def adamw_step_bytes(trainable: int, optimizer: str) -> int:
    """Memory traffic of one optimizer step (bandwidth-bound on a GPU): fp32 AdamW reads and writes weights,
    both moments and reads the gradient (28 bytes per parameter); 8-bit AdamW moves 1-byte moments (16)."""
    return trainable * (28 if optimizer == "adamw" else 16)


def low_memory_options(shape: ModelShape, gpu_memory=12, global_batch: int = 256, precision: str = "bf16",
                       attn: str = "sdpa", gpu_bandwidth_gbps: float = 900.0) -> list[dict]:
    """What lets ``shape`` train on a small card, each option with its memory and its speed cost.

    Options: the default (AdamW, EMA on the device); EMA kept on the CPU (updated from a copy of the weights,
    ideally every few steps with the decay raised to the same power: ``--ema-every``); 8-bit AdamW from
    bitsandbytes (``--optimizer adamw8bit``); both.
    Each row holds the plan and a sentence on what it costs.
    """
    counts = param_counts(shape)
    rows = []
    options = [("AdamW, EMA on the GPU", "adamw", "device"), ("EMA on the CPU", "adamw", "cpu"),
               ("8-bit AdamW (bitsandbytes)", "adamw8bit", "device"),
               ("8-bit AdamW + EMA on the CPU", "adamw8bit", "cpu")]
    for label, optimizer, ema in options:
        p = plan(shape, gpu_memory, global_batch, precision, attn, optimizer, ema)
        costs = []
        if ema == "cpu":
            s = ema_cpu_cost_s(counts["total"])
            costs.append(f"EMA update on the CPU: ~{s:.2f} s each (weights over PCIe at ~{PCIE_GBPS:g} GB/s + CPU lerp "
                         f"at ~{CPU_MEMORY_GBPS:g} GB/s; estimates, dit-bench --optimizers measures it); "
                         f"--ema-every N (decay^N, the same average) pays ~{s:.2f}/N s per step")
        if optimizer == "adamw8bit":
            t32 = adamw_step_bytes(counts["trainable"], "adamw") / (gpu_bandwidth_gbps * 1e9)
            t8 = adamw_step_bytes(counts["trainable"], "adamw8bit") / (gpu_bandwidth_gbps * 1e9)
            costs.append(f"8-bit AdamW: the step is memory-bound, ~{t8 * 1e3:.0f} ms vs ~{t32 * 1e3:.0f} ms for fp32 AdamW "
                         f"at {gpu_bandwidth_gbps:g} GB/s: no slower on a GPU. Needs bitsandbytes: "
                         "pip install -e \".[lowmem]\" (its CPU path works but is much slower: see dit-bench --optimizers)")
        if p.fits and p.setup.checkpointed:
            costs.append(f"checkpointing {p.setup.checkpointed}/{shape.depth} blocks: "
                         f"~{p.setup.checkpointed / (3 * shape.depth):.0%} more compute")
        rows.append(dict(option=label, optimizer=optimizer, ema=ema, fits=p.fits,
                         static_gib=round((p.estimate or estimate(shape, optimizer=optimizer, ema=ema)).static / GIB, 2),
                         micro_batch=p.setup.micro_batch if p.fits else None,
                         grad_accum=p.setup.grad_accum if p.fits else None,
                         checkpointed=p.setup.checkpointed if p.fits else None,
                         peak_gib=round(p.estimate.peak / GIB, 2) if p.fits else None,
                         relative_time=round(p.relative_time, 3) if p.fits else None,
                         cost="; ".join(costs) or "none (the baseline)"))
    return rows

