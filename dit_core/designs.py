"""The block designs of DiT's ablation (Peebles & Xie 2023, Sec. 3.2, Fig. 3 and 5) beside DiT's own adaLN-Zero.

The paper compares four ways of feeding the time step ``t`` and the class ``y`` to the transformer blocks, on
DiT-XL/2 by FID-50K over training, and keeps the last:

* **in-context** (:class:`InContextBlock`): ``t`` and ``y`` are appended to the image tokens as two more tokens and
  the blocks are plain ViT blocks;
* **cross-attention** (:class:`CrossAttentionBlock`): a cross-attention layer over the two-token sequence
  ``[t, y]`` after the self-attention (about 15 % more Gflops, the paper says), the sequence normalised first as a
  transformer decoder reads a normalised encoder output; ``"cross-attention-raw"``
  (:class:`CrossAttentionRawBlock`) reads it as it comes;
* **adaLN** (:class:`AdaLNBlock`): the LayerNorms' scale and shift regressed from ``t_emb + y_emb``;
* **adaLN-Zero** (:class:`dit_core.models.DiTBlock`): adaLN plus a gate on each residual branch, regressed by a
  layer that starts at zero, so that every block starts as the identity.

``DiT(block=...)`` builds any of them (:data:`dit_core.models.BLOCKS`). The designs without adaLN end with
:class:`PlainFinalLayer` (a LayerNorm with learned scale and shift, then the linear decoder).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .attention import Attention, attention, check_backend
from .layers import Mlp, modulate


class AdaLNBlock(nn.Module):
    """A DiT block with adaptive layer norm, *adaLN* (paper Sec. 3.2, the third design of Fig. 5).

    As in GANs and U-Net diffusion models, the LayerNorms' scale and shift are regressed from ``c = t_emb +
    y_emb`` instead of being learned per dimension: four vectors, shift and scale for attention and for the MLP.
    Unlike :class:`DiTBlock` there is no gate on the residual branches, and the regressing layer is initialised
    like every other linear layer (Xavier), so a block does not start as the identity. The paper's adaLN-Zero
    differs from this design by exactly those two things. (Written out beside :class:`DiTBlock` rather than derived
    from it, so that each block reads as the paper draws it and the official checkpoint's keys stay DiTBlock's.)
    """

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0, attn_backend: str = "sdpa"):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads, backend=attn_backend)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 4 * hidden_size, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, shift_mlp, scale_mlp = self.adaLN_modulation(c).chunk(4, dim=1)
        x = x + self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class CrossAttention(nn.Module):
    """Multi-head attention of the image tokens (queries) over a short conditioning sequence (keys and values),
    as in the original Transformer's decoder and in latent diffusion's class conditioning."""

    def __init__(self, dim: int, num_heads: int, backend: str = "sdpa"):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.backend = check_backend(backend)
        self.q = nn.Linear(dim, dim, bias=True)
        self.kv = nn.Linear(dim, 2 * dim, bias=True)
        self.proj = nn.Linear(dim, dim)

    def _qkv(self, x: torch.Tensor, context: torch.Tensor):
        n, t, d = x.shape
        h = self.num_heads
        q = self.q(x).reshape(n, t, h, d // h).transpose(1, 2)
        kv = self.kv(context).reshape(n, context.shape[1], 2, h, d // h).permute(2, 0, 3, 1, 4)
        return q, kv[0], kv[1]

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        out = attention(*self._qkv(x, context), self.backend)  # (n, heads, t, head_dim)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))

    def weights(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """The attention weights ``softmax(q k^T / sqrt(head_dim))``, ``(n, heads, t, len(context))``."""
        q, k, _ = self._qkv(x, context)
        return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)


class CrossAttentionBlock(nn.Module):
    """A DiT block conditioned by *cross-attention* (paper Sec. 3.2, the second design of Fig. 5).

    ``t_emb`` and ``y_emb`` form a length-two sequence, separate from the image tokens; the block is a ViT block
    (LayerNorms with learned scale and shift) with a multi-head cross-attention layer over that sequence after the
    self-attention, each sub-layer pre-normalised with a plain residual. The paper counts it as the design that
    adds the most Gflops, about 15 % at DiT-XL/2 (:func:`dit_core.measure.flops.design_table` counts it).

    The context is normalised before its keys and values are computed: a LayerNorm without parameters over each of
    the two tokens (``norm_context``), as a transformer decoder attends to a normalised encoder output: whatever the
    embeddings' scale (``t_emb`` out of an MLP, ``y_emb`` a row of a table started at standard deviation 0.02), each
    token reaches the keys and values at unit scale. :class:`CrossAttentionRawBlock` is the variant without it.
    The LayerNorm has no weights, so both variants have the same parameters and state-dict keys.
    """

    normalize_context = True

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0, attn_backend: str = "sdpa"):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads, backend=attn_backend)
        self.norm_cross = nn.LayerNorm(hidden_size, eps=1e-6)
        self.norm_context = (nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6) if self.normalize_context
                             else nn.Identity())
        self.cross_attn = CrossAttention(hidden_size, num_heads, backend=attn_backend)
        self.norm2 = nn.LayerNorm(hidden_size, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        x = x + self.cross_attn(self.norm_cross(x), self.norm_context(context))
        x = x + self.mlp(self.norm2(x))
        return x

    def context_attention(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """The cross-attention's weights over the context tokens, ``(N, heads, T, len(context))``, for the block's
        input ``x`` (after its self-attention, as in :meth:`forward`): what each image token reads of ``t`` and
        ``y``."""
        x = x + self.attn(self.norm1(x))
        return self.cross_attn.weights(self.norm_cross(x), self.norm_context(context))


class CrossAttentionRawBlock(CrossAttentionBlock):
    """The cross-attention block reading ``[t_emb, y_emb]`` as it comes, without normalising it
    (``DiT(block="cross-attention-raw")``).

    With DiT's initialisation both embeddings start small (the class table at standard deviation 0.02, the time
    MLP's weights likewise), so the keys and values of the context, and with them what the cross-attention adds to
    the image tokens and the gradient that reaches the class table, start near zero; they must grow before the
    class can steer the prediction. Kept to show what an unnormalised conditioning path does
    (``benchmarks/results/paper-findings.md`` measures it).
    """

    normalize_context = False


class InContextBlock(nn.Module):
    """A plain ViT block, for *in-context conditioning* (paper Sec. 3.2, the first design of Fig. 5).

    The block knows nothing of ``t`` and ``y``: :class:`DiT` appends ``t_emb`` and ``y_emb`` to the image tokens as
    two more tokens, treated like the others (as ViT's class token), and drops them after the last block. The
    LayerNorms learn their scale and shift; ``c`` is accepted and ignored, so every design is called alike.
    """

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0, attn_backend: str = "sdpa"):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads, backend=attn_backend)
        self.norm2 = nn.LayerNorm(hidden_size, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))

    def forward(self, x: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class PlainFinalLayer(nn.Module):
    """The final layer of the designs without adaLN (cross-attention, in-context): a LayerNorm with learned scale
    and shift, then the same linear decoder as :class:`FinalLayer`. ``c`` is accepted and ignored."""

    def __init__(self, hidden_size: int, patch_size: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)

    def forward(self, x: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
        return self.linear(self.norm_final(x))
