"""The Diffusion Transformer (Peebles & Xie, "Scalable Diffusion Models with Transformers", ICCV 2023).

The whole model in one file (its smallest pieces, adaLN's ``modulate`` and the MLP, in :mod:`dit_core.layers`),
each class named for an idea of the paper (Sec. 3.2, Fig. 3):

* :class:`PatchEmbed`       — "patchify": a ``p x p`` patch of the ``C x I x I`` input becomes one token.
* :class:`TimestepEmbedder` — the noise level ``t`` as a 256-wide sinusoidal embedding, then a 2-layer MLP.
* :class:`LabelEmbedder`    — a table of class embeddings with one extra row, the *null class*, used when the
  label is dropped for classifier-free guidance (Ho & Salimans 2022).
* :class:`DiTBlock`         — a transformer block conditioned by *adaLN-Zero*: the conditioning vector
  ``c = t_emb + y_emb`` regresses a shift, a scale and a gate for each of the two sub-layers; the regressing
  layer starts at zero so every block starts as the identity.
* :class:`FinalLayer`       — adaLN, then a linear decoder from each token back to a ``p x p x C_out`` patch.
* :class:`DiT`              — all of it, plus :meth:`DiT.unpatchify` and classifier-free guidance.

The paper's block-design ablation (Sec. 3.2, Fig. 3 and 5) compares four ways of feeding ``t`` and ``y`` to the
blocks; ``DiT(block=...)`` builds each (:data:`BLOCKS`), ``"adaln-zero"`` (:class:`DiTBlock`) by default, the
others from :mod:`dit_core.designs`: ``"adaln"`` (no gates, not zero-initialised), ``"cross-attention"`` (a
cross-attention layer over the normalised tokens ``[t_emb, y_emb]``; ``"cross-attention-raw"`` reads them as they
come) and ``"in-context"`` (``t_emb`` and ``y_emb`` appended to
the image tokens). Only adaLN-Zero has the official parameter names; the released checkpoints are all of it.

Parameter names and shapes equal those of the official checkpoints (see ``shared/reference``), so
``DiT-XL-2-256x256.pt`` loads into ``DiT_models["DiT-XL/2"]()`` as it is (:func:`dit_core.load_dit`).

Beyond the paper, for training on one GPU: a selectable attention backend (:mod:`dit_core.attention`) and
per-block gradient checkpointing (:meth:`DiT.set_grad_checkpointing`).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from .attention import Attention, check_backend
from .designs import AdaLNBlock, CrossAttentionBlock, CrossAttentionRawBlock, InContextBlock, PlainFinalLayer
from .layers import Mlp, TanhGELU, modulate  # noqa: F401 (re-exported: the pieces of every block)


# ----------------------------------------------------------------------------------------------------------
# Embeddings
# ----------------------------------------------------------------------------------------------------------


class PatchEmbed(nn.Module):
    """Patchify (paper Fig. 4): a strided ``p x p`` convolution turns ``(N, C, I, I)`` into ``(N, T, D)``
    tokens, ``T = (I / p)^2``. Halving ``p`` quadruples ``T`` and so roughly quadruples the Gflops."""

    def __init__(self, input_size: int, patch_size: int, in_channels: int, hidden_size: int):
        super().__init__()
        if input_size % patch_size != 0:
            raise ValueError(f"input_size {input_size} is not divisible by patch_size {patch_size}")
        self.patch_size = patch_size
        self.grid_size = input_size // patch_size
        self.num_patches = self.grid_size**2
        self.proj = nn.Conv2d(in_channels, hidden_size, kernel_size=patch_size, stride=patch_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


def sincos_1d(dim: int, positions: np.ndarray) -> np.ndarray:
    """Transformer sine-cosine embedding of 1-D positions: ``[sin(pos * w_k), cos(pos * w_k)]`` with
    ``w_k = 10000^(-k / (dim/2))``, ``k = 0 .. dim/2 - 1``. Returns ``(len(positions), dim)``."""
    if dim % 2:
        raise ValueError(f"sine-cosine embedding width must be even, got {dim}")
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    angles = np.outer(positions.reshape(-1).astype(np.float64), omega)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sincos_2d(dim: int, grid_size: int) -> np.ndarray:
    """Fixed 2-D position embedding (as in ViT/MAE and the DiT code): half of the channels encode the column
    index, the other half the row index. Returns ``(grid_size**2, dim)`` in row-major token order."""
    if dim % 4:
        raise ValueError(f"2-D sine-cosine embedding width must be divisible by 4, got {dim}")
    rows, cols = np.meshgrid(np.arange(grid_size), np.arange(grid_size), indexing="ij")
    return np.concatenate([sincos_1d(dim // 2, cols), sincos_1d(dim // 2, rows)], axis=1)


class TimestepEmbedder(nn.Module):
    """Embed the diffusion step ``t`` (paper Sec. 3.2, "timestep embedding"): a 256-dimensional sinusoidal
    code ``[cos(t w_k), sin(t w_k)]`` with ``w_k = 10000^(-k/128)``, then ``Linear -> SiLU -> Linear``."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256):
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size, bias=True),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size, bias=True),
        )

    @staticmethod
    def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
        """``(N,)`` possibly fractional timesteps to ``(N, dim)`` sinusoidal features (cosines first)."""
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        return emb

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freq = self.timestep_embedding(t, self.frequency_embedding_size)
        return self.mlp(freq.to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class-label embedding table with label dropout for classifier-free guidance.

    With ``dropout_prob > 0`` the table has ``num_classes + 1`` rows; row ``num_classes`` is the *null class*
    ("no label"). During training each label is replaced by it with probability ``dropout_prob`` (0.1 in the
    paper), which teaches the same network the unconditional model that guidance needs.
    """

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float):
        super().__init__()
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden_size)

    def token_drop(self, labels: torch.Tensor, force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Replace dropped labels by the null class ``num_classes``."""
        if force_drop_ids is None:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop = force_drop_ids == 1
        return torch.where(drop, torch.full_like(labels, self.num_classes), labels)

    def forward(self, labels: torch.Tensor, train: bool, force_drop_ids: torch.Tensor | None = None):
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)


# ----------------------------------------------------------------------------------------------------------
# Blocks
# ----------------------------------------------------------------------------------------------------------


class DiTBlock(nn.Module):
    """A DiT block with adaLN-Zero conditioning (paper Fig. 3, right).

    ``c`` regresses six vectors: shift, scale and gate for attention and for the MLP. The layer norms have no
    learnable affine parameters; adaLN supplies them, per sample. The residual branches are multiplied by
    the gates, which start at zero (:meth:`DiT.initialize_weights`), so each block starts as the identity.
    """

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0, attn_backend: str = "sdpa"):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads, backend=attn_backend)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


#: The block designs of the paper's ablation (Sec. 3.2, Fig. 5), by the name ``DiT(block=...)`` takes.
BLOCKS = {
    "adaln-zero": DiTBlock,
    "adaln": AdaLNBlock,
    "cross-attention": CrossAttentionBlock,
    "in-context": InContextBlock,
    "cross-attention-raw": CrossAttentionRawBlock,  # the context unnormalised (dit_core.designs says what it does)
}
DEFAULT_BLOCK = "adaln-zero"


def check_block(block: str) -> str:
    """Validate a block-design name; a ValueError that lists the designs otherwise."""
    if block not in BLOCKS:
        raise ValueError(f"unknown block design {block!r}; choose one of {', '.join(BLOCKS)} (the paper's Fig. 5; "
                         f"{DEFAULT_BLOCK} is DiT's own)")
    return block


class FinalLayer(nn.Module):
    """adaLN (shift and scale only), then a linear map from each token to a ``p x p x C_out`` patch."""

    def __init__(self, hidden_size: int, patch_size: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


# ----------------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------------


class DiT(nn.Module):
    """Diffusion Transformer: predicts the noise (and, with ``learn_sigma``, the variance interpolation) of a
    noisy latent ``x`` at step ``t`` for class ``y``.

    The constructor takes the official arguments; two more choose how it runs, not what it computes:
    ``attn_backend`` ("sdpa", "math", "xformers") and ``grad_checkpointing`` (``False``, ``True``, a number
    of blocks counted from the first, or an iterable of block indices).

    ``num_classes=0`` builds an unconditional model (no label table; ``y`` is ignored and may be ``None``).

    ``block`` chooses the block design of the paper's ablation (:data:`BLOCKS`): ``"adaln-zero"`` (DiT's own, the
    default, with the official parameter names), ``"adaln"``, ``"cross-attention"`` (``"cross-attention-raw"``
    without normalising its context) or ``"in-context"``. Every
    design has the same embedders, position embedding and linear decoder, whose weights start at zero, so every
    design's output starts at zero; only adaLN-Zero also starts each block as the identity.
    """

    def __init__(
        self,
        input_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        class_dropout_prob: float = 0.1,
        num_classes: int = 1000,
        learn_sigma: bool = True,
        attn_backend: str = "sdpa",
        grad_checkpointing: bool | int | Iterable[int] = False,
        block: str = DEFAULT_BLOCK,
    ):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.block = check_block(block)
        self.input_size = input_size
        self.patch_size = patch_size
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.hidden_size = hidden_size
        self.depth = depth
        self.num_heads = num_heads
        self.mlp_ratio = mlp_ratio
        self.class_dropout_prob = class_dropout_prob
        self.num_classes = num_classes
        self.learn_sigma = learn_sigma

        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob) if num_classes > 0 else None
        # A parameter (so that it is saved in the state dict, as officially) that is never trained.
        self.pos_embed = nn.Parameter(torch.zeros(1, self.x_embedder.num_patches, hidden_size), requires_grad=False)
        block_class = BLOCKS[self.block]
        self.blocks = nn.ModuleList(
            [block_class(hidden_size, num_heads, mlp_ratio, attn_backend) for _ in range(depth)]
        )
        final = FinalLayer if self.block in ("adaln-zero", "adaln") else PlainFinalLayer
        self.final_layer = final(hidden_size, patch_size, self.out_channels)
        self._checkpointed: frozenset[int] = frozenset()
        self.set_grad_checkpointing(grad_checkpointing)
        self.initialize_weights()

    # -- configuration ---------------------------------------------------------------------------------

    def config(self) -> dict:
        """The constructor arguments that fix the weights' shapes (plain data, e.g. for a checkpoint)."""
        return dict(
            input_size=self.input_size, patch_size=self.patch_size, in_channels=self.in_channels,
            hidden_size=self.hidden_size, depth=self.depth, num_heads=self.num_heads, mlp_ratio=self.mlp_ratio,
            class_dropout_prob=self.class_dropout_prob, num_classes=self.num_classes,
            learn_sigma=self.learn_sigma, block=self.block,
        )

    @property
    def extra_tokens(self) -> int:
        """Tokens the blocks see beside the image's: ``t`` and ``y`` (``t`` alone without classes) for the
        in-context design, none for the others."""
        return (1 + (self.y_embedder is not None)) if self.block == "in-context" else 0

    @property
    def attn_backend(self) -> str:
        return self.blocks[0].attn.backend if self.depth else "sdpa"

    def set_attention_backend(self, backend: str) -> "DiT":
        """Switch every block to the attention backend ``backend`` ("sdpa", "math" or "xformers")."""
        check_backend(backend)
        for block in self.blocks:
            block.attn.backend = backend
            if hasattr(block, "cross_attn"):
                block.cross_attn.backend = backend
        return self

    def set_grad_checkpointing(self, blocks: bool | int | Iterable[int] = True) -> "DiT":
        """Recompute the activations of some blocks in backward instead of storing them.

        ``True``: all blocks; ``False``/``0``: none; an int ``k``: the first ``k`` blocks (a middle ground when
        only some memory must be saved); an iterable: exactly those block indices.
        """
        if blocks is True:
            chosen = set(range(self.depth))
        elif blocks is False or blocks is None:
            chosen = set()
        elif isinstance(blocks, int):
            if not 0 <= blocks <= self.depth:
                raise ValueError(f"cannot checkpoint {blocks} blocks of a {self.depth}-block model")
            chosen = set(range(blocks))
        else:
            chosen = {int(i) for i in blocks}
            bad = sorted(i for i in chosen if not 0 <= i < self.depth)
            if bad:
                raise ValueError(f"block indices {bad} out of range for a {self.depth}-block model")
        self._checkpointed = frozenset(chosen)
        return self

    @property
    def checkpointed_blocks(self) -> list[int]:
        return sorted(self._checkpointed)

    # -- initialisation (paper Sec. 3.2 and the official code's choices) ---------------------------------

    def initialize_weights(self) -> None:
        """Xavier-uniform linear layers with zero bias; fixed sine-cosine ``pos_embed``; N(0, 0.02) label and
        timestep-MLP weights; and the adaLN-Zero part: every modulation layer and the final linear at zero.

        The other designs keep the final linear at zero (every design's output starts at zero) but nothing else:
        adaLN's modulation layers stay Xavier-initialised, the LayerNorms of the cross-attention and in-context
        blocks start at scale 1 and shift 0."""

        def xavier(module):
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

        self.apply(xavier)
        pos = sincos_2d(self.hidden_size, self.x_embedder.grid_size)
        if self.pos_embed.device.type != "meta":
            self.pos_embed.data.copy_(torch.from_numpy(pos).float().unsqueeze(0))
        w = self.x_embedder.proj.weight
        nn.init.xavier_uniform_(w.data.view(w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        if self.y_embedder is not None:
            nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        if self.block == "adaln-zero":
            for block in self.blocks:
                nn.init.zeros_(block.adaLN_modulation[-1].weight)
                nn.init.zeros_(block.adaLN_modulation[-1].bias)
            nn.init.zeros_(self.final_layer.adaLN_modulation[-1].weight)
            nn.init.zeros_(self.final_layer.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    # -- forward -------------------------------------------------------------------------------------------

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, T, p*p*C)`` tokens back to ``(N, C, H, W)`` images; inverse of patchify's token order."""
        c, p, g = self.out_channels, self.patch_size, self.x_embedder.grid_size
        x = x.reshape(x.shape[0], g, g, p, p, c)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(x.shape[0], c, g * p, g * p)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None, *,
                keep: torch.Tensor | None = None, mask_token: torch.Tensor | None = None, decoder_depth: int = 0,
                capture: int | None = None):
        """``x``: ``(N, C, H, W)`` noisy input; ``t``: ``(N,)`` diffusion steps; ``y``: ``(N,)`` labels, where
        ``num_classes`` means "no label". Returns ``(N, C_out, H, W)``: the noise prediction, then (with
        ``learn_sigma``) the variance interpolation channels.

        Two training options of :mod:`dit_core.train.objectives` (off by default):

        * ``keep`` ``(N, K)``: the token positions the first blocks see (masked training, MaskDiT); the last
          ``decoder_depth`` blocks see the full grid again, with ``mask_token`` + position embedding at the
          dropped positions;
        * ``capture``: also return the tokens after block ``capture`` (1-based; the kept ones only when that block
          sees the kept tokens), for representation alignment (REPA): the result is then ``(output, tokens)``.
        """
        if x.shape[-2:] != (self.input_size, self.input_size):
            raise ValueError(
                f"this DiT takes {self.input_size}x{self.input_size} inputs (latents of "
                f"{self.input_size * 8}px images with the SD VAE), got {tuple(x.shape[-2:])}"
            )
        where = self.pos_embed.device
        for name, value in (("x", x), ("t", t), ("y", y)):
            if value is not None and value.device != where:
                raise RuntimeError(
                    f"device mismatch: {name} is on {value.device} but the model's weights are on {where}; move the "
                    f"inputs with .to({str(where)!r}) or the model with model.to({str(value.device)!r}) "
                    "(dit_core.sample.generate(..., device=...) places both)"
                )
        x = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t)
        y_emb = None
        if self.y_embedder is not None:
            if y is None:
                raise ValueError("this DiT is class-conditional: pass labels y (num_classes means 'no label')")
            y_emb = self.y_embedder(y, self.training)
        if self.block in ("adaln-zero", "adaln"):
            if y_emb is not None:
                c = c + y_emb  # adaLN regresses from the sum of the two embeddings
        else:  # the two-token sequence [t, y] (one token without classes), attended to or appended
            c = torch.stack([c] if y_emb is None else [c, y_emb], dim=1)
        if keep is not None:
            if mask_token is None or not 1 <= decoder_depth < self.depth:
                raise ValueError("masked training needs a mask token and 1 <= decoder_depth < depth")
            x = torch.gather(x, 1, keep.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        extra = self.extra_tokens
        if extra:  # in-context: t and y become tokens of the sequence, the blocks get no other conditioning
            x, c = torch.cat([x, c.to(x.dtype)], dim=1), None
        checkpointed = self._checkpointed if torch.is_grad_enabled() else ()
        captured = None
        for i, block in enumerate(self.blocks):
            if keep is not None and i == self.depth - decoder_depth:  # the decoder starts: fill the dropped tokens
                x, tail = (x[:, :-extra], x[:, -extra:]) if extra else (x, None)
                full = (mask_token + self.pos_embed).to(x.dtype).expand(len(x), -1, -1)
                x = full.scatter(1, keep.unsqueeze(-1).expand(-1, -1, x.shape[-1]), x)
                if extra:
                    x = torch.cat([x, tail], dim=1)
            x = checkpoint(block, x, c, use_reentrant=False) if i in checkpointed else block(x, c)
            if i + 1 == capture:
                captured = x[:, :-extra] if extra else x
        if extra:  # the conditioning tokens leave after the last block
            x = x[:, :-extra]
        out = self.unpatchify(self.final_layer(x, c))
        return out if capture is None else (out, captured)

    def forward_with_cfg(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        y: torch.Tensor,
        cfg_scale: float,
        guidance_channels: int | None = None,
    ) -> torch.Tensor:
        """Classifier-free guidance (Ho & Salimans 2022; DiT Sec. 4): ``eps = eps_u + s (eps_c - eps_u)``.

        The batch is laid out as in the official sampler: the first half carries the class labels, the second
        half the null class, and both halves hold the same noise (only the first half of ``x`` is used). The
        output repeats the guided prediction for both halves; the other channels are each half's own.

        ``guidance_channels=None`` guides all ``in_channels`` noise channels. The official code guides only the
        first 3 of the 4 latent channels (a known quirk; the paper's FID of 2.27 was obtained with it);
        ``guidance_channels=3`` reproduces it exactly. The learned-variance channels are never guided.
        Without autograd the guided noise is written in place into the model's output (no third tensor).
        The samplers call it through :func:`dit_core.sample.samplers.guided`.
        """
        k = self._guidance_channels(guidance_channels)
        if x.shape[0] % 2:
            raise ValueError("forward_with_cfg needs an even batch: conditional half, then unconditional half")
        n = x.shape[0] // 2
        half = x[:n]
        out = self(torch.cat([half, half], dim=0), t, y)  # through __call__: a compiled model stays compiled
        if out.requires_grad:
            eps, rest = out[:, :k], out[:, k:]
            cond_eps, uncond_eps = eps.chunk(2, dim=0)
            guided = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
            return torch.cat([torch.cat([guided, guided], dim=0), rest], dim=1)
        _guide_in_place(out, n, k, cfg_scale)
        out[n:, :k] = out[:n, :k]
        return out

    def _guidance_channels(self, guidance_channels: int | None) -> int:
        k = self.in_channels if guidance_channels is None else int(guidance_channels)
        if not 0 < k <= self.in_channels:
            raise ValueError(f"guidance_channels must be in 1..{self.in_channels}, got {guidance_channels}")
        return k


def _guide_in_place(out: torch.Tensor, n: int, k: int, cfg_scale: float) -> torch.Tensor:
    """``out[:n, :k] <- uncond + s (cond - uncond)`` with ``uncond = out[n:, :k]``, computed as
    ``(cond - uncond) * s + uncond``: the same three roundings as the out-of-place form, so the same bits."""
    out[:n, :k].sub_(out[n:, :k]).mul_(cfg_scale).add_(out[n:, :k])
    return out


# ----------------------------------------------------------------------------------------------------------
# The 12 configurations of the paper (Table 1): sizes S, B, L, XL and patch sizes 2, 4, 8
# ----------------------------------------------------------------------------------------------------------

SIZES = {
    "S": dict(depth=12, hidden_size=384, num_heads=6),
    "B": dict(depth=12, hidden_size=768, num_heads=12),
    "L": dict(depth=24, hidden_size=1024, num_heads=16),
    "XL": dict(depth=28, hidden_size=1152, num_heads=16),
}
PATCH_SIZES = (2, 4, 8)


def model_kwargs(name: str) -> dict:
    """Constructor arguments of a named configuration, e.g. ``"DiT-XL/2"`` -> depth 28, width 1152, ..."""
    try:
        size, patch = name.removeprefix("DiT-").split("/")
        return dict(SIZES[size], patch_size=int(patch))
    except (ValueError, KeyError):
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(DiT_models)}") from None


def _make(name: str):
    def build(**kwargs) -> DiT:
        return DiT(**{**model_kwargs(name), **kwargs})

    build.__name__ = name.replace("-", "_").replace("/", "_")
    build.__doc__ = f"{name}: {model_kwargs(name)}; other DiT arguments as keywords."
    return build


DiT_models = {f"DiT-{s}/{p}": _make(f"DiT-{s}/{p}") for s in SIZES for p in PATCH_SIZES}
