"""GPU memory of DiT training: predicted from the model's structure, checked against what PyTorch holds.

A training step keeps five kinds of tensors on the GPU (bytes per parameter ``P`` in brackets):

* **weights** (4 P): the fp32 master copy; mixed precision computes in bf16/fp16 but keeps fp32 weights.
* **gradients** (4 P, trainable parameters only): alive from the first backward until ``zero_grad``.
* **optimizer state**: AdamW's two moments (8 P); bitsandbytes' 8-bit AdamW stores them as bytes with one
  fp32 scale per block of 256 values (about 2 P; Dettmers et al. 2022, "8-bit Optimizers via Block-wise
  Quantization").
* **EMA** (4 P): the exponential moving average of the weights that DiT samples with (decay 0.9999); it can
  live on the CPU instead.
* **activations**: what autograd saves in the forward pass to compute the backward, proportional to the
  micro-batch. For DiT these are nearly all inside the transformer blocks, and they are what gradient
  checkpointing (Chen et al. 2016) trades for a second forward pass of each block.

Weights, gradients, AdamW and EMA of DiT-XL/2 (675 M parameters) in fp32 are 13.5 GB before a single
activation, more than a 12 GB card holds. The activation estimate here is derived, not fitted: each DiT block
saves the tensors listed in :data:`BLOCK_SAVED` (read off the block's forward pass, op by op), and
:func:`measure_saved_bytes` counts what autograd really saves with ``torch.autograd.graph.saved_tensors_hooks``
so that tests and chapter 06 can compare the two. :class:`TensorMemoryTracker` follows every tensor a step
allocates and frees (on the CPU or on PyTorch's ``meta`` device, where DiT-XL/2 costs no memory) to check the
predicted *peak*; on a GPU ``torch.cuda.max_memory_allocated`` does the same.

:func:`plan` picks the micro-batch, gradient accumulation and number of checkpointed blocks that fit a card,
and :func:`low_memory_options` says what keeps DiT-XL/2 trainable on a 12 GB card and what each option
costs in speed. ``dit-plan`` is the command-line front end (:mod:`dit_core.cli.plan`).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterable

GIB = 1024**3
PRECISIONS = ("fp32", "bf16", "fp16")
ATTENTION = ("sdpa", "math", "xformers")
OPTIMIZERS = ("adamw", "adamw8bit")
EMA_PLACES = ("device", "cpu", "none")
FREQ_EMBED = 256  # width of DiT's sinusoidal timestep code (TimestepEmbedder)

#: Nominal memory of common cards in GiB (a "24 GB" RTX 3090 has 24 GiB; torch reports a little less).
GPU_MEMORY_GIB = {
    "rtx3060": 12, "rtx4070": 12, "rtx4070ti": 12, "rtx3080": 10, "rtx3080-12gb": 12, "rtx4080": 16,
    "t4": 16, "v100-16gb": 16, "v100-32gb": 32, "rtx3090": 24, "rtx4090": 24, "l4": 24, "a10": 24,
    "a100-40gb": 40, "l40s": 48, "a6000": 48, "a100-80gb": 80, "h100": 80, "h100-80gb": 80, "h200": 141,
}


def _compute_bytes(precision: str) -> int:
    """Bytes per element of tensors that autocast computes in ``precision`` (matmul outputs, GELU, ...)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return 4 if precision == "fp32" else 2


# ----------------------------------------------------------------------------------------------------------
# The model's shape
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The few numbers of a DiT that decide its memory (the constructor arguments of :class:`dit_core.DiT`).

    ``input_size`` is the side of the model's input: the latent side (image / 8) for latent DiTs, the image
    side for pixel-space models such as the digits profile.
    """

    depth: int
    hidden_size: int
    num_heads: int
    patch_size: int
    input_size: int
    in_channels: int = 4
    mlp_ratio: float = 4.0
    learn_sigma: bool = True
    num_classes: int = 1000
    class_dropout_prob: float = 0.1
    name: str = "custom"

    def __post_init__(self):
        if self.input_size % self.patch_size:
            raise ValueError(f"input_size {self.input_size} is not divisible by patch_size {self.patch_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")

    @classmethod
    def from_name(cls, name: str, image_size: int = 256, **overrides) -> "ModelShape":
        """A named configuration (``"DiT-XL/2"``) for ``image_size`` pixel images, i.e. latents of side /8."""
        from .models import model_kwargs

        if image_size % 8:
            raise ValueError(f"image_size must be a multiple of 8 (the VAE downsamples by 8), got {image_size}")
        kwargs = dict(model_kwargs(name), input_size=image_size // 8)
        kwargs.update(overrides)
        return cls(name=name, **kwargs)

    @classmethod
    def from_model(cls, model, name: str = "custom") -> "ModelShape":
        """The shape of a built :class:`dit_core.DiT` (any device, the meta device included)."""
        cfg = model.config()
        return cls(name=name, **{k: cfg[k] for k in cls.constructor_keys()})

    @staticmethod
    def constructor_keys() -> tuple[str, ...]:
        return ("depth", "hidden_size", "num_heads", "patch_size", "input_size", "in_channels", "mlp_ratio",
                "learn_sigma", "num_classes", "class_dropout_prob")

    def model_kwargs(self) -> dict:
        """Keyword arguments for :class:`dit_core.DiT`."""
        return {k: getattr(self, k) for k in self.constructor_keys()}

    @property
    def tokens(self) -> int:
        return (self.input_size // self.patch_size) ** 2

    @property
    def out_channels(self) -> int:
        return self.in_channels * (2 if self.learn_sigma else 1)

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def input_elements(self) -> int:
        """Elements of one input sample (latent or image): C x I x I."""
        return self.in_channels * self.input_size**2


def param_counts(shape: ModelShape) -> dict:
    """Parameters by part, from the architecture (equal to counting a built model; see the tests).

    Returns ``{"total", "trainable", "blocks", "embedders", "final", "pos_embed"}``; ``pos_embed`` is a fixed
    sine-cosine table stored as a parameter that is never trained (so it has no gradient or AdamW state, but
    the EMA copies it, as the official code does).
    """
    d, m, c, p = shape.hidden_size, shape.mlp_hidden, shape.in_channels, shape.patch_size
    linear = lambda n_in, n_out: n_in * n_out + n_out  # noqa: E731 - weight + bias
    block = linear(d, 3 * d) + linear(d, d) + linear(d, m) + linear(m, d) + linear(d, 6 * d)
    label_rows = shape.num_classes + int(shape.class_dropout_prob > 0) if shape.num_classes > 0 else 0
    embedders = (c * p * p * d + d) + linear(FREQ_EMBED, d) + linear(d, d) + label_rows * d
    final = linear(d, 2 * d) + linear(d, p * p * shape.out_channels)
    pos = shape.tokens * d
    total = shape.depth * block + embedders + final + pos
    return {"total": total, "trainable": total - pos, "blocks": shape.depth * block, "embedders": embedders,
            "final": final, "pos_embed": pos}


def matmul_weight_count(shape: ModelShape, checkpointed: int = 0, saved_only: bool = False) -> int:
    """Elements of the weight matrices autocast casts to bf16/fp16 (linear and conv weights, not biases).

    During the forward pass autocast caches a cast of every one. With ``saved_only`` count only the casts
    autograd keeps for backward: not those of checkpointed blocks (recomputed), nor the timestep MLP's first
    layer (its input, the sinusoidal code, needs no gradient, so its weight is not needed).
    """
    d, m, p = shape.hidden_size, shape.mlp_hidden, shape.patch_size
    block = d * 3 * d + d * d + d * m + m * d + d * 6 * d
    other = shape.in_channels * p * p * d + FREQ_EMBED * d + d * d + d * 2 * d + d * p * p * shape.out_channels
    if saved_only:
        return (shape.depth - checkpointed) * block + other - FREQ_EMBED * d
    return shape.depth * block + other


# ----------------------------------------------------------------------------------------------------------
# Activations: the tensors autograd saves, read off the forward pass
# ----------------------------------------------------------------------------------------------------------

#: What one DiT block saves for backward, per token, in the order of its forward pass (models.DiTBlock):
#: ``(what, who keeps it, width, kind)``. Widths are in elements: "D" hidden size, "M" MLP width (4 D),
#: "H" heads, "T" tokens. ``kind`` is the precision the tensor is kept in:
#:
#: * ``stream``: the fp32 residual stream and the LayerNorm path. Autocast runs ``layer_norm`` in fp32 and
#:   ``x + gate * branch`` promotes to fp32, so these stay 4 bytes even in mixed precision.
#: * ``compute``: outputs of matrix products and of GELU, 2 bytes under bf16/fp16 autocast.
#: * ``fp32``: small fp32 statistics (LayerNorm mean and 1/std, attention's log-sum-exp).
BLOCK_SAVED = (
    ("block input x", "norm1", "D", "stream"),
    ("norm1 mean, 1/std", "norm1", "2", "fp32"),
    ("norm1(x)", "modulate (grad of scale)", "D", "stream"),
    ("modulated input", "qkv linear", "D", "compute"),
    # the attention core's tensors (q, k, v, ...) come from ATTENTION_SAVED
    ("attention output (proj output)", "gate multiply", "D", "compute"),
    ("x after attention", "norm2", "D", "stream"),
    ("norm2 mean, 1/std", "norm2", "2", "fp32"),
    ("norm2(x)", "modulate (grad of scale)", "D", "stream"),
    ("modulated input", "fc1", "D", "compute"),
    ("fc1 output", "GELU", "M", "compute"),
    ("GELU output", "fc2", "M", "compute"),
    ("fc2 output", "gate multiply", "D", "compute"),
)

#: The attention core's saved tensors per token, by backend. A fused kernel (FlashAttention, the
#: memory-efficient kernel, PyTorch's CPU flash kernel, xformers) keeps q, k, v (views of the qkv output),
#: its output and one log-sum-exp per head, and recomputes the T x T probabilities in backward. The explicit
#: "math" path keeps the probabilities: H x T values per token, which is why it is quadratic in the tokens;
#: its batched matrix products also keep contiguous copies of q / sqrt(d), k and v instead of the qkv output
#: (for a batch of one these are views, and the qkv output is kept besides: one D more per token).
ATTENTION_SAVED = {
    "sdpa": (("q, k, v (views of the qkv output)", "sdpa", "3D", "compute"),
             ("attention output (proj input)", "sdpa + proj", "D", "compute"),
             ("log-sum-exp per head", "sdpa", "H", "fp32")),
    "math": (("q / sqrt(d), k, v (copies for bmm)", "q k^T, probs @ v", "3D", "compute"),
             ("softmax probabilities", "softmax, probs @ v", "H*T", "compute"),
             ("heads merged (proj input copy)", "proj", "D", "compute")),
}
ATTENTION_SAVED["xformers"] = ATTENTION_SAVED["sdpa"]

#: Per sample (not per token) each block keeps SiLU(c) for adaLN's linear, the two (1 + scale) vectors and
#: the six-way modulation output (the gates are views of it).
BLOCK_SAVED_PER_SAMPLE = (("adaLN: SiLU(c), 2 x (1+scale), 6D output", "adaLN, modulate, gates", "9D", "compute"),)

#: Hybrid loss (MSE + variational bound) of dit_core.diffusion: about 19 fp32 tensors of the input's size
#: (Gaussian KL and the discretised decoder likelihood keep their intermediates) + 2 bool masks. Measured
#: with :func:`measure_saved_bytes`; tiny next to the blocks (0.3 % for DiT-S/2).
#: ``"none"``: the model's output summed (nothing saved), for the meta device where the diffusion loss cannot
#: run (it checks its timesteps with ``.item()``).
LOSS_BYTES_PER_ELEMENT = {"hybrid": 19 * 4 + 2, "mse": 4, "none": 0}


def _width(expr: str, shape: ModelShape) -> int:
    values = {"D": shape.hidden_size, "M": shape.mlp_hidden, "H": shape.num_heads, "T": shape.tokens}
    total = 1
    for factor in expr.split("*"):
        digits = factor.rstrip("DMHT")
        symbol = factor[len(digits):]
        total *= (int(digits) if digits else 1) * (values[symbol] if symbol else 1)
    return total


def _kind_bytes(kind: str, precision: str) -> int:
    return _compute_bytes(precision) if kind == "compute" else 4


def check_attention(attn: str) -> str:
    if attn not in ATTENTION:
        raise ValueError(f"attention backend must be one of {', '.join(ATTENTION)}, got {attn!r}")
    return attn


def block_saved_table(shape: ModelShape, precision: str = "fp32", attn: str = "sdpa") -> list[dict]:
    """The rows of :data:`BLOCK_SAVED` with their bytes per token and per sample, for one block."""
    check_attention(attn)
    rows = list(BLOCK_SAVED[:4]) + list(ATTENTION_SAVED[attn]) + list(BLOCK_SAVED[4:])
    out = []
    for what, keeper, width, kind in rows:
        n = _width(width, shape)
        b = _kind_bytes(kind, precision)
        out.append(dict(tensor=what, kept_by=keeper, width=width, dtype=kind, bytes_per_token=n * b,
                        bytes_per_sample=n * b * shape.tokens))
    for what, keeper, width, kind in BLOCK_SAVED_PER_SAMPLE:
        n = _width(width, shape) * _kind_bytes(kind, precision)
        out.append(dict(tensor=what, kept_by=keeper, width=width + "/img", dtype=kind, bytes_per_token=0,
                        bytes_per_sample=n))
    return out


def block_bytes_per_sample(shape: ModelShape, precision: str = "fp32", attn: str = "sdpa") -> int:
    """Bytes one block saves for backward per sample (the sum of :func:`block_saved_table`)."""
    return sum(r["bytes_per_sample"] for r in block_saved_table(shape, precision, attn))


def outside_blocks_bytes_per_sample(shape: ModelShape, precision: str = "fp32", loss: str = "hybrid") -> int:
    """Bytes saved outside the blocks per sample: patch embedding, timestep/label embedding, final layer, loss."""
    cb = _compute_bytes(precision)
    d, t = shape.hidden_size, shape.tokens
    embed = shape.input_elements * cb  # patchify conv input
    embed += FREQ_EMBED * cb + 2 * d * cb  # timestep MLP: its input, its hidden pre/post SiLU
    if shape.num_classes > 0:
        embed += 8 + d * 4  # int64 label; c = t_emb + y_emb is fp32 (the label table is not autocast)
    else:
        embed += d * cb  # c is the timestep MLP's output
    final = 2 * d * cb  # SiLU(c) and (1 + scale)
    final += t * (d * 4 + 8 + d * 4 + d * cb)  # norm input, mean/rstd, norm output, modulated input
    if loss not in LOSS_BYTES_PER_ELEMENT:
        raise ValueError(f"loss must be one of {', '.join(LOSS_BYTES_PER_ELEMENT)}, got {loss!r}")
    per_element = LOSS_BYTES_PER_ELEMENT["mse" if loss == "hybrid" and not shape.learn_sigma else loss]
    loss_bytes = shape.input_elements * per_element
    if loss == "hybrid" and shape.learn_sigma:
        loss_bytes += 17  # per sample: the t == 0 mask (bool) and two int64 timestep tensors
    return embed + final + loss_bytes


def checkpointed_block_bytes_per_sample(shape: ModelShape) -> int:
    """A checkpointed block keeps only its input ``x`` (fp32 residual stream); ``c`` is shared by all blocks."""
    return shape.tokens * shape.hidden_size * 4


@dataclass(frozen=True)
class ActivationEstimate:
    """Activation bytes of one forward pass (all per sample except ``weight_casts``)."""

    per_sample: int  # everything kept for backward at the end of the forward pass
    blocks: int  # of which in blocks
    outside: int  # of which outside the blocks
    block_full: int  # one un-checkpointed block
    block_checkpointed: int  # one checkpointed block
    recompute: int  # extra during backward: one checkpointed block recomputed (0 without checkpointing)
    weight_casts: int  # bytes, not per sample: bf16/fp16 weight copies saved for backward
    weight_casts_forward: int  # bytes: all of autocast's weight copies, alive until the forward ends

    def as_dict(self) -> dict:
        return asdict(self)


def activation_bytes(shape: ModelShape, precision: str = "fp32", attn: str = "sdpa", checkpointed: int = 0,
                     loss: str = "hybrid") -> ActivationEstimate:
    """Bytes autograd keeps per sample with ``checkpointed`` of the ``depth`` blocks checkpointed."""
    if not 0 <= checkpointed <= shape.depth:
        raise ValueError(f"checkpointed must be in 0..{shape.depth} (the model's depth), got {checkpointed}")
    full = block_bytes_per_sample(shape, precision, attn)
    ckpt = checkpointed_block_bytes_per_sample(shape)
    blocks = (shape.depth - checkpointed) * full + checkpointed * ckpt
    outside = outside_blocks_bytes_per_sample(shape, precision, loss)
    cast = 0 if precision == "fp32" else 2
    return ActivationEstimate(per_sample=blocks + outside, blocks=blocks, outside=outside, block_full=full,
                              block_checkpointed=ckpt, recompute=full if checkpointed else 0,
                              weight_casts=cast * matmul_weight_count(shape, checkpointed, saved_only=True),
                              weight_casts_forward=cast * matmul_weight_count(shape))


# ----------------------------------------------------------------------------------------------------------
# A whole training step
# ----------------------------------------------------------------------------------------------------------

#: The VAE encoder in the training loop (no gradient): its fp32 weights (the whole AutoencoderKL is loaded,
#: 83.65 M parameters for sd-vae-ft-ema) and its transient peak per image: five 128-channel maps at full
#: resolution in the encoder's compute dtype (the first down block's ResNet holds its input, the GroupNorm
#: and SiLU outputs, the convolution's output and the residual sum). Measured with
#: :class:`TensorMemoryTracker`: exactly 5.0 maps in fp32 (meta device, 256 and 512 px) and in bf16 autocast
#: (CPU, 64 px); checked in tests/test_memory.py.
VAE_PARAMS = 83_653_863
VAE_PEAK_MAPS = 5.0


def optimizer_state_bytes(trainable: int, optimizer: str) -> int:
    """AdamW: two fp32 moments. 8-bit AdamW: two uint8 moments and one fp32 absmax per block of 256."""
    if optimizer == "adamw":
        return 8 * trainable
    if optimizer == "adamw8bit":
        return 2 * trainable + 2 * 4 * math.ceil(trainable / 256)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")


@dataclass(frozen=True)
class TrainSetup:
    """How a step is run: everything that changes memory but not the model."""

    micro_batch: int = 32
    grad_accum: int = 1
    checkpointed: int = 0  # number of blocks, counted from the first
    precision: str = "bf16"
    attn: str = "sdpa"
    optimizer: str = "adamw"
    ema: str = "device"
    vae_in_loop: bool = False  # encode images every step instead of reading pre-extracted latents
    vae_precision: str = "fp32"

    def __post_init__(self):
        _compute_bytes(self.precision)
        _compute_bytes(self.vae_precision)
        check_attention(self.attn)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.ema not in EMA_PLACES:
            raise ValueError(f"ema must be one of {', '.join(EMA_PLACES)}, got {self.ema!r}")
        if self.micro_batch < 1 or self.grad_accum < 1:
            raise ValueError(f"micro_batch and grad_accum must be >= 1, got {self.micro_batch}, {self.grad_accum}")

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum


@dataclass
class MemoryEstimate:
    """Predicted device memory of one training step, by component (bytes)."""

    shape: ModelShape
    setup: TrainSetup
    params: int
    trainable: int
    weights: int
    grads: int
    optimizer: int
    ema: int
    activations: int  # micro_batch x per-sample activations kept at the end of the forward pass
    weight_casts: int  # autocast's bf16/fp16 weight copies, all alive until the forward pass ends
    weight_casts_saved: int  # of which kept for backward (not those of checkpointed blocks)
    recompute: int  # one checkpointed block's activations, rebuilt in backward
    grad_buffers: int  # gradients of one block's activations while backward runs through it
    tail: int  # activations still alive when backward reaches the first block: that block + outside blocks
    vae_weights: int  # the VAE's weights, loaded for the whole run (0 with pre-extracted latents)
    vae_encode: int  # the encoder's transient peak for the micro-batch
    batch: int  # the micro-batch's inputs: x_0 and its noise (and the images with the VAE in the loop)
    activation: ActivationEstimate = field(repr=False)

    @property
    def static(self) -> int:
        """Always allocated: weights, optimizer state, EMA, the VAE if it runs in the loop (gradients are
        counted where they live)."""
        return self.weights + self.optimizer + self.ema + self.vae_weights

    def moments(self) -> dict:
        """Bytes beyond ``static + batch`` at the four moments of a step where the peak can fall.

        * ``vae``: encoding the micro-batch with the VAE in the loop;
        * ``forward end``: all activations and all of autocast's weight copies;
        * ``backward start``: the activations, the copies kept for backward, the gradient buffers of the last
          block, and its recomputation if it is checkpointed (blocks are checkpointed from the first, so a
          partly checkpointed model recomputes only after the other blocks' activations are freed);
        * ``backward end``: (almost) all gradients, the first block's activations (recomputed or kept), what
          the patch and timestep embedders saved, and the gradient buffers.

        Gradients from earlier micro-batches are alive throughout when accumulating (the first micro-batch
        of a step has none after ``zero_grad(set_to_none=True)``).
        """
        grads_before = self.grads if self.setup.grad_accum > 1 else 0
        last_recomputed = self.recompute if self.setup.checkpointed == self.shape.depth else 0
        return {
            "vae": grads_before + self.vae_encode,
            "forward end": grads_before + self.activations + self.weight_casts,
            "backward start": grads_before + self.activations + self.weight_casts_saved + self.grad_buffers
            + last_recomputed,
            "backward end": self.grads + self.tail + self.grad_buffers,
        }

    @property
    def peak(self) -> int:
        """The predicted peak: ``static + batch`` plus the largest of :meth:`moments`."""
        return self.static + self.batch + max(self.moments().values())

    @property
    def peak_moment(self) -> str:
        moments = self.moments()
        return max(moments, key=moments.get)

    def components(self) -> dict:
        return {"weights": self.weights, "gradients": self.grads, "optimizer state": self.optimizer,
                "EMA": self.ema, "activations": self.activations, "autocast weight copies": self.weight_casts,
                "recomputed block": self.recompute, "gradient buffers": self.grad_buffers,
                "VAE in the loop": self.vae_weights + self.vae_encode, "batch": self.batch}

    def as_dict(self) -> dict:
        return {"model": self.shape.name, "shape": asdict(self.shape), "setup": asdict(self.setup),
                "params": self.params, "trainable": self.trainable, **self.components(), "moments": self.moments(),
                "peak_moment": self.peak_moment, "peak": self.peak, "activation_per_sample": self.activation.per_sample}

    def table(self) -> str:
        lines = [f"{k:<24}{v / GIB:>9.2f} GiB" for k, v in self.components().items()]
        lines.append(f"{'predicted peak':<24}{self.peak / GIB:>9.2f} GiB   (at {self.peak_moment})")
        return "\n".join(lines)


def estimate(shape: ModelShape, setup: TrainSetup | None = None, loss: str = "hybrid", **setup_kwargs) -> MemoryEstimate:
    """Predict the peak device memory of a training step of ``shape`` run as ``setup``.

    ``setup_kwargs`` override fields of ``setup`` (or of the default :class:`TrainSetup`), e.g.
    ``estimate(shape, micro_batch=16, checkpointed=28, precision="bf16")``.
    """
    setup = replace(setup or TrainSetup(), **setup_kwargs)
    counts = param_counts(shape)
    act = activation_bytes(shape, setup.precision, setup.attn, setup.checkpointed, loss)
    n = setup.micro_batch
    cb = _compute_bytes(setup.precision)
    # While backward runs through a block: the gradient of the MLP's hidden activations (M wide, compute
    # dtype; when the second one appears, the GELU output it replaces has been freed) and of the residual
    # stream (two D-wide fp32 buffers), per token.
    grad_buffers = n * shape.tokens * (shape.mlp_hidden * cb + 2 * shape.hidden_size * 4)
    vae_weights = vae_encode = 0
    batch = 2 * n * shape.input_elements * 4
    if setup.vae_in_loop:
        image = shape.input_size * 8
        vae_weights = VAE_PARAMS * 4
        vae_encode = int(n * VAE_PEAK_MAPS * 128 * image * image * _compute_bytes(setup.vae_precision))
        batch += n * 3 * image * image * 4
    return MemoryEstimate(
        shape=shape, setup=setup, params=counts["total"], trainable=counts["trainable"],
        weights=4 * counts["total"], grads=4 * counts["trainable"],
        optimizer=optimizer_state_bytes(counts["trainable"], setup.optimizer),
        ema=4 * counts["total"] if setup.ema == "device" else 0,
        activations=n * act.per_sample, weight_casts=act.weight_casts_forward,
        weight_casts_saved=act.weight_casts, recompute=n * act.recompute, grad_buffers=grad_buffers,
        tail=n * (act.block_full + act.outside), vae_weights=vae_weights, vae_encode=vae_encode, batch=batch,
        activation=act,
    )


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
    allocator's fragmentation. For every micro-batch that divides ``global_batch`` the planner takes the
    fewest checkpointed blocks that fit, estimates the time per image (:func:`relative_step_time`) and keeps
    the fastest; ties go to the larger micro-batch.
    """
    if global_batch < 1:
        raise ValueError(f"global_batch must be >= 1, got {global_batch}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    total = parse_memory(gpu_memory) * GIB
    budget = int(total * (1 - margin) - reserved_gib * GIB)
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
    out = []
    if ema == "device":
        out.append("--ema cpu")
    if optimizer == "adamw":
        out.append("--optimizer adamw8bit")
    if precision == "fp32":
        out.append("--precision bf16")
    return out or ["a larger card, or a smaller model"]


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
    ideally every few steps with the decay raised to the same power); 8-bit AdamW from bitsandbytes; both.
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
                         f"at ~{CPU_MEMORY_GBPS:g} GB/s); overlap it with the next step or update every N steps "
                         f"(decay^N) to pay ~{s:.2f}/N s per step")
        if optimizer == "adamw8bit":
            t32 = adamw_step_bytes(counts["trainable"], "adamw") / (gpu_bandwidth_gbps * 1e9)
            t8 = adamw_step_bytes(counts["trainable"], "adamw8bit") / (gpu_bandwidth_gbps * 1e9)
            costs.append(f"8-bit AdamW: the step is memory-bound, ~{t8 * 1e3:.0f} ms vs ~{t32 * 1e3:.0f} ms for fp32 AdamW "
                         f"at {gpu_bandwidth_gbps:g} GB/s: no slower on a GPU. Needs `pip install bitsandbytes` "
                         "(its CPU path works but is much slower: see dit-bench --optimizers)")
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


# ----------------------------------------------------------------------------------------------------------
# Measurement: what autograd saves, and every tensor a step allocates
# ----------------------------------------------------------------------------------------------------------


def _storage_key(t) -> int:
    return t.untyped_storage()._cdata


def measure_saved_bytes(model, batch_size: int, precision: str = "fp32", loss: str = "hybrid",
                        device=None, seed: int = 0) -> dict:
    """Count the bytes autograd saves for backward in one forward pass of ``model`` (+ the diffusion loss).

    Every tensor handed to ``torch.autograd.graph.saved_tensors_hooks`` is counted once per storage (views of
    one tensor share it), parameters excluded. A checkpointed block hides its internals from the hooks (they
    are recomputed), but it keeps its input alive: that is counted with a forward pre-hook. Works on the CPU
    and on the ``meta`` device (no memory, any size); autocast applies on the CPU only.

    Returns ``{"bytes", "storages"}``. The bytes include autocast's weight copies, which do not grow with the
    batch: :func:`measure_saved_per_sample` separates the two.
    """
    import torch

    from .diffusion import create_diffusion
    from .runtime import autocast

    device = torch.device(device or next(model.parameters()).device)
    shape = ModelShape.from_model(model)
    diffusion = create_diffusion("", learn_sigma=shape.learn_sigma)
    params = {_storage_key(p) for p in model.parameters()}
    seen: dict[int, int] = {}

    def note(t):
        key = _storage_key(t)
        if key not in params and key not in seen:
            seen[key] = t.untyped_storage().nbytes()

    def pack(t):
        note(t)
        return t

    def pre_hook(block, args):
        if torch.is_grad_enabled() and block.training and args[0].requires_grad:
            note(args[0])

    ckpt = set(getattr(model, "checkpointed_blocks", []))
    handles = [b.register_forward_pre_hook(pre_hook) for i, b in enumerate(model.blocks) if i in ckpt]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(batch_size, shape.in_channels, shape.input_size, shape.input_size, generator=gen).to(device)
    t = torch.randint(0, diffusion.num_timesteps, (batch_size,), generator=gen).to(device)
    y = torch.randint(0, max(shape.num_classes, 1), (batch_size,), generator=gen).to(device)
    def forward(x_t, t_, y=None):
        with autocast(device, precision):
            return model(x_t, t_, y).float()

    was_training = model.training
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if loss == "none":
                out = forward(x, t, y if shape.num_classes else None).sum()
            elif loss == "hybrid":
                if device.type == "meta":
                    raise ValueError("the diffusion loss cannot run on the meta device; use loss='none' there")
                kwargs = dict(y=y if shape.num_classes else None)
                out = diffusion.training_losses(forward, x, t, kwargs)["loss"].mean()
            else:
                raise ValueError(f"measure_saved_bytes: loss must be 'hybrid' or 'none', got {loss!r}")
        del out
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {"bytes": sum(seen.values()), "storages": len(seen)}


def measure_saved_per_sample(model, precision: str = "fp32", loss: str = "hybrid", batch_sizes=(2, 4)) -> dict:
    """Per-sample saved bytes as the slope between two batch sizes (constant terms, such as autocast's
    weight copies, cancel). Batch sizes of at least 2 avoid size-1 dimensions, for which some reshapes are
    views instead of copies."""
    a, b = batch_sizes
    ma = measure_saved_bytes(model, a, precision, loss)
    mb = measure_saved_bytes(model, b, precision, loss)
    per_sample = (mb["bytes"] - ma["bytes"]) / (b - a)
    return {"per_sample": per_sample, "constant": ma["bytes"] - a * per_sample, "at": {a: ma, b: mb}}


class TensorMemoryTracker:
    """Follow every tensor storage created while active; report bytes alive now and at the peak.

    A ``TorchDispatchMode`` sees each operator's outputs (forward, backward, optimizer; autocast casts too).
    An output that does not share storage with one of the operator's inputs is a new allocation; it is
    counted until its storage is freed (a ``weakref.finalize`` on the storage). Tensors that existed before
    (weights, optimizer state) are not counted: add them yourself. The CPU analogue of
    ``torch.cuda.max_memory_allocated`` minus what was allocated before, without the allocator's rounding;
    it also works on the ``meta`` device, so the peak of a DiT-XL/2 step can be measured without memory.

    >>> with TensorMemoryTracker() as mem:           # doctest: +SKIP
    ...     loss = model(x, t, y).square().mean(); loss.backward()
    >>> mem.peak                                     # doctest: +SKIP
    """

    def __init__(self):
        self.live = 0
        self.peak = 0
        self._keys: set[int] = set()
        self._finalizers: list = []
        self._mode = None

    def _free(self, key: int, nbytes: int) -> None:
        if key in self._keys:
            self._keys.discard(key)
            self.live -= nbytes

    def track(self, tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._keys:
            return
        nbytes = storage.nbytes()
        self._keys.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self._finalizers.append(weakref.finalize(storage, self._free, key, nbytes))

    def reset_peak(self) -> None:
        self.peak = self.live

    def __enter__(self) -> "TensorMemoryTracker":
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                inputs = {_storage_key(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and _storage_key(t) not in inputs:
                        tracker.track(t)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._mode = None

    def close(self) -> None:
        """Stop following the storages still alive (their later frees are no longer counted)."""
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()
        self._keys.clear()


def simulate_peak(shape: ModelShape, setup: TrainSetup, device: str = "meta", seed: int = 0) -> dict:
    """Peak tensor bytes of a training step of ``shape`` run as ``setup``, followed op by op.

    The step: ``zero_grad(set_to_none=True)``, ``grad_accum`` forward/backward passes of ``micro_batch``
    samples (loss: the output summed, so that nothing but the model is measured), an AdamW step, the EMA
    update. The second step is measured (the optimizer state exists from the first). On the ``meta`` device
    nothing is allocated, so DiT-XL/2 at batch 256 costs a few seconds; there autocast does not apply (use
    ``precision="fp32"``) and sdpa runs as the math path (use ``attn="math"``). Compare with
    ``estimate(shape, setup, loss="none").peak``.

    Returns ``{"peak", "start"}``: the peak, and the bytes alive when the step begins (weights, EMA,
    optimizer state and the previous step's gradients, which ``zero_grad`` then frees).
    """
    import torch

    from .models import DiT
    from .runtime import autocast

    if setup.vae_in_loop:
        raise ValueError("simulate_peak measures the DiT step only; use vae_in_loop=False")
    dev = torch.device(device)
    if dev.type == "meta" and (setup.precision != "fp32" or setup.attn != "math"):
        raise ValueError("on the meta device use precision='fp32' and attn='math' (no autocast, sdpa is decomposed)")
    torch.manual_seed(seed)
    with torch.device(dev):
        model = DiT(**shape.model_kwargs(), attn_backend=setup.attn)
    model.set_grad_checkpointing(setup.checkpointed).train()
    ema = [p.detach().clone() for p in model.parameters()] if setup.ema == "device" else []
    params = [p for p in model.parameters() if p.requires_grad]
    if setup.optimizer == "adamw8bit":
        raise ValueError("simulate_peak runs torch's AdamW; the 8-bit optimizer's state is modelled, not simulated")
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, foreach=False)
    n = setup.micro_batch
    x = torch.randn(n, shape.in_channels, shape.input_size, shape.input_size, device=dev)
    t = torch.randint(0, 1000, (n,), device=dev)
    y = torch.randint(0, max(shape.num_classes, 1), (n,), device=dev) if shape.num_classes else None
    def step():
        opt.zero_grad(set_to_none=True)
        for _ in range(setup.grad_accum):
            with autocast(dev, setup.precision):
                out = model(x, t, y)
            out.float().sum().backward()
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema, model.parameters()):
                e.lerp_(p, 1e-4)

    step()
    tracker = TensorMemoryTracker()
    static = list(model.parameters()) + ema + optimizer_tensors(opt) + [x, t] + ([y] if y is not None else [])
    static += [p.grad for p in params if p.grad is not None]
    for tensor in static:
        tracker.track(tensor)
    del static, tensor  # hold no references: the old gradients must be freed by zero_grad
    start = tracker.live
    with tracker:
        step()
    tracker.close()
    return {"peak": tracker.peak, "start": start}


def tensor_bytes(tensors: Iterable) -> int:
    """Bytes of distinct storages among ``tensors`` (e.g. parameters, optimizer state)."""
    seen = {}
    for t in tensors:
        seen[_storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def optimizer_tensors(optimizer) -> list:
    import torch

    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


__all__ = [
    "ModelShape", "TrainSetup", "MemoryEstimate", "ActivationEstimate", "Plan", "param_counts", "activation_bytes",
    "block_saved_table", "estimate", "plan", "low_memory_options", "measure_saved_bytes", "measure_saved_per_sample",
    "TensorMemoryTracker", "GPU_MEMORY_GIB", "parse_memory", "relative_step_time",
]
