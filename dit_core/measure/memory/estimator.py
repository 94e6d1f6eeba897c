"""The memory planner's estimate: device memory of a DiT training step, predicted from the model's structure.

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
:func:`dit_core.measure.memory.probes.measure_saved_bytes` counts what autograd really saves, so that tests
and chapter 06 can compare the two. The planner plans DiT's adaLN-Zero blocks only: :func:`param_counts` counts all
four block designs of the paper's ablation, but for another design :func:`check_planned` stops the activation estimate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

GIB = 1024**3
PRECISIONS = ("fp32", "bf16", "fp16")
ATTENTION = ("sdpa", "math", "xformers")
OPTIMIZERS = ("adamw", "adamw8bit", "muon")
EMA_PLACES = ("device", "cpu", "none")
FREQ_EMBED = 256  # width of DiT's sinusoidal timestep code (TimestepEmbedder)


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
    block: str = "adaln-zero"

    def __post_init__(self):
        from ...models import check_block  # a clear error for an unknown block design
        check_block(self.block)
        if self.input_size % self.patch_size:
            raise ValueError(f"input_size {self.input_size} is not divisible by patch_size {self.patch_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")

    @classmethod
    def from_name(cls, name: str, image_size: int = 256, **overrides) -> "ModelShape":
        """A named configuration (``"DiT-XL/2"``) for ``image_size`` pixel images, i.e. latents of side /8."""
        from ...models import model_kwargs

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
                "learn_sigma", "num_classes", "class_dropout_prob", "block")

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
    the EMA copies it, as the official code does). Every block design is counted (``shape.block``).
    """
    d, m, c, p = shape.hidden_size, shape.mlp_hidden, shape.in_channels, shape.patch_size
    linear = lambda n_in, n_out: n_in * n_out + n_out  # noqa: E731 - weight + bias
    adaln = {"adaln-zero": 6, "adaln": 4}.get(shape.block)  # vectors adaLN regresses (else: 2 learned norms)
    block = linear(d, 3 * d) + linear(d, d) + linear(d, m) + linear(m, d) + (linear(d, adaln * d) if adaln else 4 * d)
    block += 2 * d + linear(d, d) + linear(d, 2 * d) + linear(d, d) if shape.block.startswith("cross-attention") else 0
    label_rows = shape.num_classes + int(shape.class_dropout_prob > 0) if shape.num_classes > 0 else 0
    embedders = (c * p * p * d + d) + linear(FREQ_EMBED, d) + linear(d, d) + label_rows * d
    final = (linear(d, 2 * d) if adaln else 2 * d) + linear(d, p * p * shape.out_channels)
    pos = shape.tokens * d
    total = shape.depth * block + embedders + final + pos
    return {"total": total, "trainable": total - pos, "blocks": shape.depth * block, "embedders": embedders,
            "final": final, "pos_embed": pos}


def check_planned(shape: ModelShape) -> None:
    """A ValueError unless the planner can estimate ``shape``'s activations (adaLN-Zero blocks)."""
    if shape.block != "adaln-zero":
        raise ValueError(f"the memory planner plans DiT's adaLN-Zero blocks only, not {shape.block} blocks (read off "
                         "models.DiTBlock); measure this design with dit_core.measure.memory.measure_saved_bytes")


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
    check_planned(shape)
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

#: The VAE encoder in the training loop runs without gradient, so autograd saves none of it; what it costs is
#: its fp32 weights (the whole AutoencoderKL is loaded: 83,653,863 parameters for sd-vae-ft-ema) and the tensors
#: alive at the worst moment of one encode, which :func:`vae_encode_bytes` derives from the encoder's code.
VAE_PARAMS = 83_653_863
DEVICE_TYPES = ("cuda", "cpu")


@dataclass(frozen=True)
class VaeShape:
    """The numbers of a diffusers ``AutoencoderKL`` that decide the memory of encoding in the training loop."""

    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    params: int = VAE_PARAMS  # the whole AutoencoderKL (encoder and decoder), loaded for the run
    name: str = "sd-vae-ft-ema"

    def __post_init__(self):
        channels = tuple(self.block_out_channels)
        object.__setattr__(self, "block_out_channels", channels)
        if any(b > 2 * a for a, b in zip(channels, channels[1:])):
            raise ValueError(f"block_out_channels {channels}: vae_encode_bytes assumes that no encoder stage more "
                             "than doubles the channels (then the first, full-resolution stage holds the peak)")
        if self.layers_per_block < 1:
            raise ValueError(f"layers_per_block must be >= 1, got {self.layers_per_block}")

    @property
    def downsample(self) -> int:
        """Pixels per latent cell along one side (8 for SD's VAE)."""
        return 2 ** (len(self.block_out_channels) - 1)

    @classmethod
    def from_model(cls, vae, name: str = "custom") -> "VaeShape":
        """The shape of a built ``AutoencoderKL`` (any device)."""
        cfg = vae.config
        return cls(tuple(cfg.block_out_channels), int(cfg.layers_per_block),
                   sum(p.numel() for p in vae.parameters()), name)


#: Stable Diffusion's VAE (sd-vae-ft-ema, the paper's), what "VAE in the loop" means unless a setup says otherwise.
SD_VAE = VaeShape()


def _resnet_moments(held: int, x: int, precision: str, device: str) -> tuple[list[int], int]:
    """Bytes per element alive at each moment of one diffusers ``ResnetBlock2D`` without gradient, and the bytes
    per element of its output. ``held``: what the callers keep alive (the encoder holds its block's input);
    ``x``: the bytes per element of the block's input. Under autocast a convolution casts an fp32 input to the
    compute dtype (a copy) and writes its output in it; CUDA's autocast runs ``group_norm`` in fp32 (a copy of
    a lower-precision input, an fp32 output), the CPU's in the compute dtype."""
    cb = _compute_bytes(precision)
    amp = precision != "fp32"
    norm_out = 4 if (amp and device == "cuda") else cb

    def norm(inp):  # (moment, output bytes)
        cast = 4 if (amp and device == "cuda" and inp != 4) else 0
        return cast + norm_out, norm_out

    def conv(inp):
        return (cb if inp != cb else 0) + cb

    moments = []
    base = held + x
    m, n1 = norm(x)
    moments.append(base + m)  # norm1
    moments.append(base + n1 + n1)  # SiLU: its input and output (same dtype)
    moments.append(base + n1 + conv(n1))  # conv1: SiLU output, its cast, the conv's output
    m, n2 = norm(cb)
    moments.append(base + cb + m)  # norm2 while conv1's output is alive
    moments.append(base + n2 + n2)  # SiLU
    moments.append(base + n2 + conv(n2))  # conv2
    out = max(x, cb) if amp else 4  # the residual sum promotes
    moments.append(base + cb + out + out)  # (input + h) / scale: the sum and the quotient
    return moments, out


def vae_encode_bytes(vae: VaeShape, image_size: int, precision: str = "fp32", device: str = "cuda") -> int:
    """Bytes alive at the worst moment of encoding one ``image_size`` image with ``vae``, without gradient.

    Derived from diffusers' encoder: ``conv_in`` maps the image to ``C0`` channels at full resolution, and the
    first down block runs ``layers_per_block`` ResNet blocks on it; the encoder holds the block's input while the
    block runs, so from the second ResNet on one more full-resolution map is alive. The worst moment is the
    residual sum ``(input + h) / scale`` (fp32: 5 maps of ``C0 x H x W`` with two ResNets, 4 with one) or, under
    CUDA autocast, the second GroupNorm, which runs in fp32 (7 bf16-sized maps). Later stages have at most twice
    the channels on a quarter of the pixels (:class:`VaeShape` checks it), so they never hold more.
    Equal to what :class:`~.probes.TensorMemoryTracker` follows on the CPU (tests/test_memory.py).

    Not counted: a convolution's workspace. On a GPU, cuDNN picks its algorithms by the workspace it can get
    (PyTorch falls back to leaner ones when an allocation fails), so with much free memory the encoder takes
    far more than its tensors (chapter 06 shows the measured figures).
    """
    if device not in DEVICE_TYPES:
        raise ValueError(f"device must be one of {', '.join(DEVICE_TYPES)}, got {device!r}")
    if image_size % vae.downsample:
        raise ValueError(f"image_size {image_size} is not a multiple of the VAE's downsampling ({vae.downsample})")
    cb = _compute_bytes(precision)
    worst = 0
    x = cb  # conv_in's output
    for j in range(vae.layers_per_block):
        held = cb if j > 0 else 0  # the encoder's reference to conv_in's output (the block's input)
        moments, x = _resnet_moments(held, x, precision, device)
        worst = max(worst, *moments)
    return worst * vae.block_out_channels[0] * image_size * image_size


def optimizer_state_bytes(trainable: int, optimizer: str) -> int:
    """AdamW: two fp32 moments. 8-bit AdamW: two uint8 moments and one fp32 absmax per block of 256. Muon
    (dit_core.train.muon): counted as AdamW, an upper bound (the blocks' matrices keep one buffer, not two)."""
    if optimizer in ("adamw", "muon"):
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
    vae: VaeShape | None = None  # the VAE in the loop (None: SD's, :data:`SD_VAE`)
    device: str = "cuda"  # where the step runs: autocast differs between "cuda" and "cpu" (see vae_encode_bytes)

    def __post_init__(self):
        _compute_bytes(self.precision)
        _compute_bytes(self.vae_precision)
        if self.device not in DEVICE_TYPES:
            raise ValueError(f"device must be one of {', '.join(DEVICE_TYPES)}, got {self.device!r}")
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
        vae = setup.vae or SD_VAE
        image = shape.input_size * vae.downsample
        vae_weights = vae.params * 4
        vae_encode = n * vae_encode_bytes(vae, image, setup.vae_precision, setup.device)
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


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"

